"""Checkpoints to a private Hugging Face repo, and back.

The repo mirrors the output folder:
    checkpoint-N/...              OUTPUT/checkpoint-N as the Trainer and DeepSpeed wrote it
    checkpoint-N/manifest.json    every file of it, with its size and sha256; committed after the files,
                                  in a commit of its own: a checkpoint is on the Hub when its manifest is
    final/..., final/manifest.json   the 16-bit model, the same way
    run/summary.json, run/loss.png, run/settings.json, ...   the run's reports
    README.md                     the model card
The Hub keeps the newest `keep` checkpoints that have a manifest; an older one is deleted only once a
newer manifest is up. The token lives in the HfApi object only: it is never logged nor written, and a
file that contains it is never uploaded.

    preflight.py   at the start: token, write access, a private repo (HubTarget)
    uploader.py    the background thread in the controller: when a checkpoint goes up; finish() at the end
    manifest.py    how a folder goes up whole (snapshot, hash, files, then manifest) and how one is verified
    retention.py   which checkpoints stay on the Hub; the storage of deleted ones freed
    resume.py      a fresh disk resumes from the newest verified checkpoint on the Hub
    card.py        the run's reports and the model card, at the end
    errors.py      HubError, TokenFound; HTTP statuses, retries, log lines without the token

The modules are imported by name (sft.hub.uploader, ...): this file imports none of them.
"""
