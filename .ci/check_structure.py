#!/usr/bin/env python3
"""The structure ARCHITECTURE.md promises, checked on every CI run:
- every command file (crates/forte/src/commands/) is under 150 lines, help text included;
- no function of a crate's own code (tests aside) is over 80 lines;
- every path and code name ARCHITECTURE.md and docs/mechanisms.md put in backticks exists.
Prints each breach; exit 1 if there is any."""
import os, re, subprocess, sys

COMMAND_LINES = 150
FUNCTION_LINES = 80
DOCS = ["ARCHITECTURE.md", "docs/mechanisms.md"]

repo = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
os.chdir(repo)
tracked = subprocess.check_output(["git", "ls-files"], text=True).split()
breaches = []


def commands_are_thin():
    for f in tracked:
        if f.startswith("crates/forte/src/commands/") and f.endswith(".rs"):
            n = len(open(f).read().splitlines())
            if n >= COMMAND_LINES:
                breaches.append(f"{f}: {n} lines; a command parses, calls one entry point and prints (under {COMMAND_LINES})")


FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions_are_short():
    for f in tracked:
        if not (f.startswith("crates/") and "/src/" in f and f.endswith(".rs")):
            continue
        lines = open(f, errors="replace").read().split("\n")
        tests_from = None
        for i, line in enumerate(lines):
            if tests_from is None and re.match(r"^\s*#\[cfg\(test\)\]", line):
                tests_from = i
            m = FN.match(line)
            if not m or line.rstrip().endswith(";") or (tests_from is not None and i > tests_from):
                continue
            end = i
            while end < len(lines) and not re.match("^" + m.group(1) + r"\}", lines[end]):
                end += 1
            if end - i + 1 > FUNCTION_LINES:
                breaches.append(f"{f}:{i + 1}: fn {m.group(7)} is {end - i + 1} lines (at most {FUNCTION_LINES}): split it into steps named for what they do")


def path_exists(p):
    p = p.rstrip("/").split(" ")[0]
    if os.path.exists(p) or os.path.exists("crates/" + p):
        return True
    # A path given relative to its crate or folder: some tracked file lies under it.
    return any(("/" + f).endswith("/" + p) or ("/" + p + "/") in ("/" + f) for f in tracked)


def expand(p):
    m = re.search(r"\{([^}]*)\}", p)
    if not m:
        return [p]
    return [p[: m.start()] + alt + p[m.end():] for alt in m.group(1).split(",")]


def docs_name_what_exists():
    sources = [f for f in tracked if f.startswith(("crates/", "bench/", "integrations/", ".ci/", "examples/"))
               and f.endswith((".rs", ".py", ".sh", ".toml", ".js", ".css", ".html"))]
    words = set()
    for f in sources:
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", open(f, errors="replace").read()))
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", open(doc).read(), flags=re.S)
        for tok in re.findall(r"`([^`\n]+)`", text):
            tok = tok.strip()
            if re.match(r"^[\w.-]+(/[\w.{},*-]*)+/?$", tok) and "://" not in tok:
                if tok.startswith(("v1/", "api/", "DEST", "OUTBOX", "LANDING", "QUARANTINE", "sites/", "keys/")):
                    continue  # places at run time, not in the tree
                for p in expand(tok):
                    if not path_exists(p):
                        breaches.append(f"{doc}: `{tok}` is not in the tree")
            elif re.match(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)*(::\{[\w, :]+\})?$", tok):
                for name in re.findall(r"[A-Za-z_]\w*", tok):
                    if len(name) >= 3 and name not in ("crate", "self", "super", "forte") and name not in words:
                        breaches.append(f"{doc}: `{tok}`: {name} is named nowhere in the code")


commands_are_thin()
functions_are_short()
docs_name_what_exists()
for b in breaches:
    print(b)
sys.exit(1 if breaches else 0)
