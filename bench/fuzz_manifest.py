#!/usr/bin/env python3
"""Hostile manifests against `cibox batch list`, bounded in count and time.

Mutates the example manifest (random bytes, deleted and duplicated lines, long and
control-character values, lists where mappings belong, numbers out of range) and adds
generated attacks (alias bombs, deep nesting, many keys). Each case must end within
10 s and 1 GiB of address space with exit 0 or 2, never a panic or a signal, and with
at most one `cibox: error:` line on stderr that holds no control character and
names none of serde's or cibox's internal types.
Prints how many cases ran, how many held, and the worst time.
Usage: bench/fuzz_manifest.py [path/to/cibox] [cases] [seconds]   (defaults: target/release/cibox 500 120)
"""
import os, random, re, resource, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIBOX = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/cibox")
CASES = int(sys.argv[2]) if len(sys.argv) > 2 else 500
BUDGET = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
BASE = open(os.path.join(ROOT, "examples/demo/cibox.yaml")).read()
# Words of serde's or of cibox's own types, never meant for the user.
INTERNAL = re.compile(r"untagged enum|did not match any variant|\bRaw[A-Z]\w*|\bstruct [A-Z]")
rng = random.Random(int(os.environ.get("FUZZ_SEED", "1")))


def alias_bomb(levels):
    doc = "version: 1\nproject: p\nx0: &a0 [x, x]\n"
    for i in range(1, levels):
        doc += f"x{i}: &a{i} [*a{i-1}, *a{i-1}]\n"
    return doc


def generated():
    yield alias_bomb(30)
    yield alias_bomb(rng.randint(5, 40))
    yield "version: 1\nproject: " + "[" * 50000 + "]" * 50000 + "\n"
    yield "version: 1\nproject: p\n" + "".join(f"k{i}: {i}\n" for i in range(200000))
    yield BASE.replace("container:", "container: [0.5, 256m, 1g, 64, host]\ncontainer_:", 1)
    yield BASE + "\ncontainer: {cpus: 1e-10}\n"
    yield "version: 1\nproject: \"a\\nb\\u001b[2J\"\n"


def mutate(text):
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        i = rng.randrange(len(lines))
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2 and lines[i]:
            j = rng.randrange(len(lines[i]))
            lines[i] = lines[i][:j] + chr(rng.randrange(1, 0x250)) + lines[i][j + 1:]
        elif op == 3:
            lines[i] += " " + rng.choice(["&a", "*a", "<<: *a", "[", "]", "{", "}", "'", '"', "- ", ": "])
        elif op == 4:
            lines[i] += "x" * rng.choice([10, 1000, 100000])
        elif op == 5:
            lines[i] = lines[i].replace(": ", ": [", 1)
        else:
            lines[i] += rng.choice(["\x1b[31m", "\u202e", "\x00", "\r", str(10 ** rng.randint(5, 40)), "-1", "1e400"])
    return "\n".join(lines)


def limits():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def main():
    start, ran, held, worst = time.time(), 0, 0, 0.0
    failures = []
    cases = list(generated())
    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, ".git"))
        path = os.path.join(work, "cibox.yaml")
        while ran < CASES and time.time() - start < BUDGET:
            text = cases[ran] if ran < len(cases) else mutate(BASE)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            t = time.time()
            try:
                p = subprocess.run([CIBOX, "batch", "list"], cwd=work, capture_output=True,
                                   timeout=10, preexec_fn=limits)
                code, err = p.returncode, p.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                code, err = "timeout", ""
            worst = max(worst, time.time() - t)
            ran += 1
            errors = [l for l in err.splitlines() if l.startswith("cibox: error:")]
            ok = (code in (0, 2) and "panicked" not in err and len(errors) <= 1
                  and not any(c in l for l in errors for c in "\x1b\r\x00\u202e")
                  and not any(INTERNAL.search(l) for l in errors))
            if ok:
                held += 1
            else:
                failures.append((code, text[:200], err[:300]))
    print(f"manifest fuzz: {ran} cases in {time.time() - start:.0f} s, held {held}/{ran}, worst {worst:.2f} s")
    for code, text, err in failures[:5]:
        print(f"  FAILED ({code}): {text!r}\n    {err!r}")
    sys.exit(0 if held == ran else 1)


if __name__ == "__main__":
    main()
