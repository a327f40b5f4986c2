"""Git LFS uploads, "basic" transfer only: the batch API hands out an upload and a verify URL per
object not stored yet; the PUT streams the object to disk and checks its sha256 and size."""

from __future__ import annotations

import hashlib
import re

from .common import HubError


class LfsAPI:
    """The LFS endpoints, mixed into the request handler."""

    def h_lfs_batch(self, m) -> None:
        """Git LFS batch API: an upload + verify href per object not stored yet."""
        rtype = "datasets" if m["prefix"] else "models"
        repo_id = m["repo_id"]
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "Only the 'upload' operation is supported")
        self._writable(rtype, repo_id)
        objects = []
        for obj in body.get("objects") or []:
            oid, size = obj.get("oid"), obj.get("size")
            answer = {"oid": str(oid), "size": size if isinstance(size, int) else -1}
            if not (isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{64}", oid)) or not isinstance(size, int):
                answer["error"] = {"code": 422, "message": "Invalid oid or size"}
            elif not self.hub.store.has_blob(oid, size):
                ticket = self.hub._new_ticket(oid, size)
                answer["authenticated"] = True
                answer["actions"] = {
                    "upload": {"href": f"{self._base_url()}/_lfs/upload/{ticket}", "header": {}},
                    "verify": {"href": f"{self._base_url()}/_lfs/verify/{ticket}", "header": {}},
                }
            objects.append(answer)
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                   content_type="application/vnd.git-lfs+json")  # fmt: skip

    def h_lfs_put(self, m) -> None:
        """The upload href: stream the body to disk, check sha256 and size, then store it."""
        oid, size = self.hub._ticket(m["ticket"])
        tmp, digest, received = self.hub.store.new_tmp_path(), hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                for piece in self._iter_body():
                    digest.update(piece)
                    out.write(piece)
                    received += len(piece)
            if received != size or digest.hexdigest() != oid:
                raise HubError(400, f"Uploaded content does not match oid {oid} / size {size}")
            self.hub.store.adopt_blob(tmp, oid)
        finally:
            tmp.unlink(missing_ok=True)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def h_lfs_verify(self, m) -> None:
        oid, size = self.hub._ticket(m["ticket"])
        body = self._json_body()
        if body.get("oid") != oid or not self.hub.store.has_blob(oid, body.get("size", size)):
            raise HubError(404, f"LFS object {oid} is not stored (or has another size)")
        self._json({"success": True})
