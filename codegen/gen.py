"""Generates the C++ registrations, the StableHLO emitters and the parity tests from specs/*.yaml.

    python -m codegen.gen            # write generated/
    python -m codegen.gen --check    # exit 1 if generated/ differs from what the specs give (CI)
    bazel run //codegen:gen          # the same as the first, through Bazel
"""

from __future__ import annotations

import argparse
import os
import sys

import jinja2

if __package__ in (None, ""):  # run as a script (bazel's py_binary): make `codegen` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.model import SWEEP_SAMPLES, SpecError, load_specs  # noqa: E402

TEMPLATES = {
    "generated/ops/emitters.cpp": "emitters.cpp.j2",
    "generated/ops/register.cpp": "register.cpp.j2",
    "generated/ops/meta.cpp": "meta.cpp.j2",
    "generated/tests/test_parity.py": "test_parity.py.j2",
}


def repo_root() -> str:
    return os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def render(root: str) -> dict[str, str]:
    specs = load_specs(os.path.join(root, "specs"), root)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    meta_headers = sorted({o.meta.header for spec in specs for o in spec.overloads if o.meta})
    return {out: env.get_template(tpl).render(specs=specs, meta_headers=meta_headers, sweep_samples=SWEEP_SAMPLES)
            for out, tpl in TEMPLATES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with generated/ instead of writing")
    args = parser.parse_args(argv)
    root = repo_root()
    try:
        files = render(root)
    except SpecError as e:
        print(f"codegen: error: {e}", file=sys.stderr)
        return 1
    stale = []
    for rel, text in files.items():
        path = os.path.join(root, rel)
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if args.check:
        if stale:
            print("codegen: generated/ is out of date with specs/ (run `python -m codegen.gen`): "
                  + ", ".join(stale), file=sys.stderr)
            return 1
        print(f"codegen: generated/ matches specs/ ({len(files)} files)")
        return 0
    print(f"codegen: wrote {len(stale)} of {len(files)} files under {os.path.join(root, 'generated')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
