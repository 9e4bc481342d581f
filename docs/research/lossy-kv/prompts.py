"""The prompt set: distinct windows of 256-1024 tokens of natural English / Markdown text found on this machine.

Documents, in this order: caked's README.md and docs/**/*.md (this folder excluded), /usr/share/common-licenses/*,
then /usr/share/doc/*/copyright (shuffled with the seed). Identical files are counted once. One window per
document: its length is drawn uniformly from [min_len, max_len] (capped at the document's length), its offset
uniformly; documents shorter than min_len are skipped, and so is a window identical to an earlier one.
`encode` turns a document's text into a list of token ids (a tokenizer's, or the UTF-8 bytes for the torch engine).
"""
import glob
import hashlib
import os
import random

REPO = "/work/main"


def documents(seed=0):
    here = os.path.dirname(os.path.abspath(__file__))
    project = [os.path.join(REPO, "README.md")] + sorted(
        p for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
        if not os.path.abspath(p).startswith(here))
    licenses = sorted(glob.glob("/usr/share/common-licenses/*"))
    copyrights = sorted(glob.glob("/usr/share/doc/*/copyright"))
    random.Random(seed).shuffle(copyrights)
    seen, out = set(), []
    for path in project + licenses + copyrights:
        if not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen or not text.strip():
            continue
        seen.add(digest)
        out.append((path, text))
    return out


def windows(encode, count, min_len=256, max_len=1024, seed=0):
    """Returns [(source path, offset, token ids)] of `count` distinct windows."""
    rng = random.Random(seed)
    out, seen = [], set()
    for path, text in documents(seed):
        ids = encode(text)
        n = len(ids)
        if n < min_len:
            continue
        length = min(rng.randint(min_len, max_len), n)
        offset = rng.randint(0, n - length)
        w = tuple(ids[offset:offset + length])
        if w in seen:
            continue
        seen.add(w)
        out.append((path, offset, list(w)))
        if len(out) == count:
            return out
    raise RuntimeError(f"only {len(out)} windows of >= {min_len} tokens found, {count} asked")


if __name__ == "__main__":
    ws = windows(lambda t: list(t.encode("utf-8")), 240)
    lens = sorted(len(w) for _, _, w in ws)
    print(len(ws), "byte windows; length min/median/max", lens[0], lens[len(lens) // 2], lens[-1])
    print("sources:", sum(p.startswith(REPO) for p, _, _ in ws), "caked docs,",
          sum("common-licenses" in p for p, _, _ in ws), "common-licenses,",
          sum(p.endswith("/copyright") for p, _, _ in ws), "copyright files")
