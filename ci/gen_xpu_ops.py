"""Generate the emulator's table of the aten operators an XPU build of torch implements, from a torch-xpu-ops checkout.

A real XPU build has a kernel for the XPU dispatch key only for the operators Intel's torch-xpu-ops and PyTorch core
implement; every other operator that reaches the XPU key lands in torch-xpu-ops' boxed fallback
(``src/ATen/native/xpu/XPUFallback.template``), which raises ``NotImplementedError`` unless
``PYTORCH_ENABLE_XPU_FALLBACK=1``. This script writes ``lightning_xpu/emulator/csrc/xpu_ops.inc``, the operators that
do not land there, each with where its kernel comes from:

- TORCH_XPU_OPS: an ``XPU`` dispatch entry of torch-xpu-ops' ``yaml/native/native_functions.yaml`` (torchgen also
  generates the kernels of the functional and in-place variants whose ``structured_delegate`` is such an entry),
  or an ``m.impl("...")`` in a ``TORCH_LIBRARY_IMPL(aten, XPU, m)`` block of its ``src/``;
- PYTORCH_CORE: the same two kinds of registration in PyTorch core: the ``XPU`` entries of PyTorch's own
  ``native_functions.yaml`` (read from the installed torch's torchgen, or ``--torch-yaml``), and ``CORE_IMPLS``
  below (``m.impl`` registrations of ``aten/src/ATen/native/mkldnn/xpu/``, read from PyTorch's sources);
- CPU_FALLBACK: the explicit list of XPUFallback.template, registered to run on the CPU with a warning.

Operators with a composite kernel (CompositeImplicitAutograd, CompositeExplicitAutograd, decompositions) never reach
the XPU fallback, on hardware as on the emulator, so they need no row.

    python ci/gen_xpu_ops.py PATH [--ref REF] [--torch-yaml FILE] [--output FILE | --check FILE]

PATH is a torch-xpu-ops work tree, or with ``--ref`` any git directory of it (a bare mirror too), read at REF.
``--check`` fails (exit 1) when FILE is not what the script would write; exit 2 on bad input.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ci.gen_deterministic_alerts import Checkout, generator_parser, mask, matching, write_or_check  # noqa: E402

OUTPUT = REPO / "lightning_xpu" / "emulator" / "csrc" / "xpu_ops.inc"
YAML = "yaml/native/native_functions.yaml"
SOURCES = "src/"
FALLBACK = "src/ATen/native/xpu/XPUFallback.template"

# PyTorch core's TORCH_LIBRARY_IMPL(aten, XPU, m) registrations, written down from its sources (no PyTorch checkout
# is at hand to scan; the revision read was not pinned to v2.13.0). Both kinds of operator have a composite kernel
# on torch 2.13 (convolution_overrideable: CompositeExplicitAutograd, tensordot.out: CompositeImplicitAutograd), so
# these rows only matter where an XPU kernel replaces it. PyTorch core's other XPU kernels are `XPU:` entries of its
# native_functions.yaml, or dispatch stubs behind operators that have composite kernels.
CORE_IMPLS: dict[str, str] = {
    "convolution_overrideable": "aten/src/ATen/native/mkldnn/xpu/Conv.cpp",
    "convolution_backward_overrideable": "aten/src/ATen/native/mkldnn/xpu/Conv.cpp",
    "tensordot.out": "aten/src/ATen/native/mkldnn/xpu/Blas.cpp",
}

KINDS = ("TORCH_XPU_OPS", "PYTORCH_CORE", "CPU_FALLBACK")


@dataclass
class Table:
    kinds: dict[str, str] = field(default_factory=dict)  # "name.overload" -> one of KINDS
    overridden: list[str] = field(default_factory=list)  # XPU kernels that the fallback list replaces

    def add(self, op: str, kind: str) -> None:
        # The fallback list is registered after torchgen's kernels in the same file (RegisterXPU_0.cpp), so it
        # replaces them; otherwise the first origin found is kept.
        if kind == "CPU_FALLBACK" and self.kinds.get(op, kind) != kind:
            self.overridden.append(op)
            self.kinds[op] = kind
        self.kinds.setdefault(op, kind)


def yaml_xpu_ops(text: str) -> list[str]:
    """The ``name.overload`` of each operator of a native_functions.yaml that gets an XPU kernel: an ``XPU``
    dispatch entry, or a ``structured_delegate`` naming an operator that has one."""
    entries: list[dict] = []
    in_dispatch = False
    for line in text.splitlines():
        if line.startswith("- func:"):
            name = line[len("- func:") :].strip().split("(", 1)[0]
            entries.append({"name": name, "keys": set(), "delegate": None})
            in_dispatch = False
        elif not entries or not line.strip() or line.lstrip().startswith("#"):
            continue
        elif line.startswith("    ") and in_dispatch:
            keys = line.split("#", 1)[0].partition(":")[0]
            entries[-1]["keys"].update(k.strip() for k in keys.split(","))
        elif line.startswith("  "):
            key, _, value = line.strip().partition(":")
            in_dispatch = key.strip() == "dispatch"
            if key.strip() == "structured_delegate":
                entries[-1]["delegate"] = value.split("#", 1)[0].strip()
    direct = {e["name"] for e in entries if "XPU" in e["keys"]}
    return sorted(e["name"] for e in entries if e["name"] in direct or e["delegate"] in direct)


def library_impls(text: str, namespace: str = "aten", key: str = "XPU") -> list[str]:
    """The operators that ``m.impl("...")`` registers, by string literal, in ``TORCH_LIBRARY_IMPL(namespace, key, m)``
    blocks of a C++ source (comments ignored)."""
    code, masked = mask(text)
    found = []
    for block in re.finditer(rf"\bTORCH_LIBRARY_IMPL\s*\(\s*{namespace}\s*,\s*{key}\s*,\s*(\w+)\s*\)\s*{{", masked):
        body = code[block.end() - 1 : matching(masked, block.end() - 1)]
        impl = rf'\b{block.group(1)}\s*\.\s*impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?"([\w:.]+)"'
        found += [op.removeprefix(f"{namespace}::") for op in re.findall(impl, body)]
    return found


def fallback_list(text: str) -> list[str]:
    """The operators XPUFallback.template registers to run on the CPU: the strings of its ``fallback_list``."""
    code, masked = mask(text)
    m = re.search(r"\bfallback_list\s*=\s*{", masked)
    if m is None:
        raise SystemExit(f"error: {FALLBACK} has no fallback_list: the script needs updating for this release")
    body = code[m.end() - 1 : matching(masked, m.end() - 1)]
    return re.findall(r'"([\w.]+)"', body)


def default_torch_yaml() -> Path | None:
    spec = importlib.util.find_spec("torchgen")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"


def analyse(checkout: Checkout, torch_yaml: str) -> Table:
    table = Table()
    for op in yaml_xpu_ops(checkout.read(YAML)):
        table.add(op, "TORCH_XPU_OPS")
    for name in checkout.files(SOURCES):
        if name.endswith((".cpp", ".h", ".hpp", ".template")):
            for op in library_impls(checkout.read(name)):
                table.add(op, "TORCH_XPU_OPS")
    for op in [*yaml_xpu_ops(torch_yaml), *CORE_IMPLS]:
        table.add(op, "PYTORCH_CORE")
    for op in fallback_list(checkout.read(FALLBACK)):
        table.add(op, "CPU_FALLBACK")
    return table


def render(table: Table, checkout: Checkout, torch_label: str) -> str:
    counts = {k: sum(1 for v in table.kinds.values() if v == k) for k in KINDS}
    lines = [
        "// GENERATED by ci/gen_xpu_ops.py: do not edit, run it again.",
        f"// From intel/torch-xpu-ops {checkout.label}, commit {checkout.commit},",
        f"// and PyTorch core's XPU kernels: the XPU entries of {torch_label},",
        f"// and {', '.join(sorted(CORE_IMPLS))} (m.impl in aten/src/ATen/native/mkldnn/xpu/).",
        "// The aten operators with a kernel for the XPU dispatch key in that release, {\"name.overload\", origin}:",
        f"// {counts['TORCH_XPU_OPS']} from torch-xpu-ops, {counts['PYTORCH_CORE']} from PyTorch core, "
        f"{counts['CPU_FALLBACK']} on XPUFallback.template's list that runs on the CPU",
        "// with a warning. Any other operator that reaches the XPU fallback raises NotImplementedError there, unless",
        "// PYTORCH_ENABLE_XPU_FALLBACK=1. Included by xpu_ops.cpp.",
    ]
    if table.overridden:
        lines.append(f"// XPU kernels that the fallback list replaces: {', '.join(sorted(table.overridden))}.")
    lines.append("")
    lines += [f'{{"{op}", XpuKernel::{kind}}},' for op, kind in sorted(table.kinds.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = generator_parser(__doc__.split("\n\n")[0], OUTPUT)
    parser.add_argument("--torch-yaml", type=Path, help="PyTorch's native_functions.yaml (default: torchgen's)")
    args = parser.parse_args(argv)
    if not args.path.is_dir():
        print(f"error: {args.path} is not a directory", file=sys.stderr)
        return 2
    checkout = Checkout(args.path, args.ref)
    if not checkout.files(YAML) or not checkout.files(FALLBACK):
        print(f"error: {args.path} has no {YAML} or {FALLBACK}: not a torch-xpu-ops checkout", file=sys.stderr)
        return 2
    torch_yaml = args.torch_yaml or default_torch_yaml()
    if torch_yaml is None or not torch_yaml.is_file():
        print("error: no PyTorch native_functions.yaml: install torch, or pass --torch-yaml", file=sys.stderr)
        return 2
    if args.torch_yaml:
        torch_label = f"PyTorch's {args.torch_yaml.name}"
    else:
        torch_label = f"torch {importlib.metadata.version('torch')}'s native_functions.yaml (torchgen's copy)"
    table = analyse(checkout, torch_yaml.read_text())
    text = render(table, checkout, torch_label)
    print(text.split("\n\n")[0])
    return write_or_check(text, args.output, args.check, "ci/gen_xpu_ops.py")


if __name__ == "__main__":
    sys.exit(main())
