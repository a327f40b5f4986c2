"""Checkpoints to a private Hugging Face repo, and back.

The repo holds the model where people look for it (layout.py):
    config.json, model.safetensors, tokenizer files   the final 16-bit model, at the root: from_pretrained("owner/repo")
    manifest.json                 every file of the final model, with its size and sha256; committed after the files,
                                  in a commit of its own: the model is on the Hub when its manifest is
    checkpoints/checkpoint-N/...  OUTPUT/checkpoint-N as the Trainer and DeepSpeed wrote it, and its manifest.json
    run/summary.json, run/loss.png, run/events.jsonl, ...   the run's reports
    README.md                     the model card
on main, or on the branch SFT_HUB_REVISION names. The Hub keeps the newest `keep` checkpoints that have a
manifest; an older one is deleted only once a newer manifest is up. The token lives in the HfApi object only:
it is never logged nor written, and a file that contains it is never uploaded.

    preflight.py   at the start: token, write access, a private repo (HubTarget)
    uploader.py    the background thread in the controller: when a checkpoint goes up; finish() at the end
    manifest.py    how a folder goes up whole (snapshot, hash, files, then manifest) and how one is verified
    retention.py   which checkpoints stay on the Hub; the storage of deleted ones freed
    resume.py      a fresh disk resumes from the newest verified checkpoint on the Hub
    card.py        the run's reports and the model card (modelcard.py), at the end
    layout.py      where each thing goes in the repo (and where an earlier version of the job put it)
    progress.py    an upload's bytes, rate and ETA while it runs
    errors.py      HubError, TokenFound; HTTP statuses, retries, log lines without the token

The modules are imported by name (sft.hub.uploader, ...): this file imports none of them.
"""
