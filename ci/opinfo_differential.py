"""Which operators accept on one device what they refuse on another: the emulated XPU against CUDA.

The device-independent contracts (aten's device checks, non-contiguous inputs, 0-dim CPU tensors) must hold alike
on every accelerator, so the emulator may not accept what CUDA refuses. This runs PyTorch's OpInfo samples
(``torch.testing._internal.common_methods_invocations.op_db``), generated on the CPU with a fixed seed and then moved
to the device, in four forms, and records for each whether the operator ran or which exception it raised:

- ``as-is``: the sample on the device;
- ``non-contiguous``: every tensor input replaced by a non-contiguous copy;
- ``cpu-operand``: the first tensor argument after the input (dimension > 0) left on the CPU: aten refuses it;
- ``cpu-scalar-operand``: the same argument as a 0-dim CPU tensor, where it is one element: aten accepts it.

  python ci/opinfo_differential.py run --device cuda --out cuda.json           # on an NVIDIA machine
  LIGHTNING_XPU_EMULATOR=1 python ci/opinfo_differential.py run --device xpu --out xpu.json
  python ci/opinfo_differential.py compare cuda.json xpu.json --report benchmarks/results/opinfo-differential.md

`compare` exits 1 while a difference has no reason in ``BY_DESIGN``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMS = ("as-is", "non-contiguous", "cpu-operand", "cpu-scalar-operand")
SAMPLES_PER_OP = 2
# Differences that are not the emulator being kinder than an Intel GPU: the operator (OpInfo name, before any
# variant) and why. Any other difference is unexplained, and `compare` exits 1.
BY_DESIGN = {
    "histogram": "XPU has the kernel (torch-xpu-ops `Histogram.cpp`); CUDA has none",
    "jiterator_": "`torch.cuda.jiterator`, CUDA's runtime kernel compiler: CUDA only",
    "to_sparse": "the emulator has no sparse layouts: stricter than an Intel GPU (a false failure, never a false pass)",
    "_batch_norm_with_update": "CUDA's refusal is cuDNN's (`Expected contiguous tensor ... for cudnn_batch_norm`), "
    "not aten's; XPU's batch norm is torch-xpu-ops' own kernel (not checked on hardware)",
}


def by_design(name: str) -> str | None:
    """Why a difference on operator ``name`` is expected, or None."""
    for prefix, why in BY_DESIGN.items():
        if name == prefix or name.startswith(prefix + ".") or (prefix.endswith("_") and name.startswith(prefix)):
            return why
    return None


def _map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _first_operand(args: tuple) -> int | None:
    import torch

    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return i
    return None


def _strided(sample: Any) -> bool:
    import torch

    layouts: list[Any] = []
    _map_tensors((sample.input, tuple(sample.args), dict(sample.kwargs)), lambda t: layouts.append(t.layout))
    return all(layout == torch.strided for layout in layouts)


def _forms(sample: Any, device: str) -> dict[str, tuple[Any, tuple, dict] | None]:
    """The four forms of one CPU sample, on ``device`` (None where a form does not apply)."""
    import torch
    from torch.testing._internal.common_utils import noncontiguous_like

    to_device = lambda v: _map_tensors(v, lambda t: t.to(device))  # noqa: E731
    inp, args, kwargs = to_device(sample.input), to_device(tuple(sample.args)), to_device(dict(sample.kwargs))
    forms: dict[str, tuple[Any, tuple, dict] | None] = {"as-is": (inp, args, kwargs)}
    noncontig = lambda v: _map_tensors(v, lambda t: noncontiguous_like(t) if t.numel() > 1 else t)  # noqa: E731
    forms["non-contiguous"] = (noncontig(inp), noncontig(args), noncontig(kwargs))
    i = _first_operand(args)
    if i is None or not isinstance(inp, torch.Tensor):
        forms["cpu-operand"] = forms["cpu-scalar-operand"] = None
        return forms
    cpu_args = list(args)
    cpu_args[i] = sample.args[i].clone()
    forms["cpu-operand"] = (inp, tuple(cpu_args), kwargs)
    if sample.args[i].numel() == 1:
        scalar_args = list(args)
        scalar_args[i] = sample.args[i].clone().reshape(())
        forms["cpu-scalar-operand"] = (inp, tuple(scalar_args), kwargs)
    else:
        forms["cpu-scalar-operand"] = None
    return forms


def _outcome(op: Any, form: tuple[Any, tuple, dict], device: str) -> str:
    import torch

    inp, args, kwargs = form
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(inp, *args, **kwargs)
            getattr(torch, device).synchronize()
        return "ok"
    except Exception as err:  # the outcome is the exception's type, whatever it is
        return type(err).__name__


def run(device: str) -> dict[str, dict[str, str]]:
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    results: dict[str, dict[str, str]] = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        torch.manual_seed(0)
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:SAMPLES_PER_OP]
        except Exception as err:  # an OpInfo that cannot make CPU samples on this torch: recorded, not compared
            results[name] = {"samples": type(err).__name__}
            continue
        outcomes: dict[str, str] = {}
        for k, sample in enumerate(samples):
            if not _strided(sample):  # sparse and nested layouts: outside what either device is compared on
                continue
            for form_name, form in _forms(sample, device).items():
                if form is not None:
                    outcomes[f"{k}:{form_name}"] = _outcome(op, form, device)
        results[name] = outcomes
    return results


def compare(reference: dict, other: dict) -> list[tuple[str, str, str, str]]:
    """Rows (op, sample:form, reference outcome, other outcome) where exactly one side ran the operator."""
    rows = []
    for name in sorted(set(reference) & set(other)):
        for key in sorted(set(reference[name]) & set(other[name])):
            a, b = reference[name][key], other[name][key]
            if (a == "ok") != (b == "ok"):
                rows.append((name, key, a, b))
    return rows


def _report(rows: list[tuple[str, str, str, str]], ref: dict, other: dict, meta: dict) -> str:
    shared = set(ref) & set(other)
    compared = sum(len(set(ref[n]) & set(other[n])) for n in shared)
    unexplained = [row for row in rows if by_design(row[0]) is None]
    lines = [
        "# OpInfo differential: the emulated XPU against CUDA",
        "",
        f"Generated by `ci/opinfo_differential.py` ({meta['reference']} against {meta['other']}): PyTorch's OpInfo "
        f"samples ({SAMPLES_PER_OP} per operator, float32, made on the CPU with seed 0) in the forms "
        f"{', '.join(f'`{f}`' for f in FORMS)}. {compared} cases of {len(shared)} operators compared "
        f"({len(set(ref) ^ set(other))} operators exist in one torch's OpInfo database only); "
        f"{len(rows)} where one device ran the operator and the other raised, "
        f"**{len(unexplained)} of them unexplained** (the rest are differences by design, each with its reason).",
        "",
    ]
    by_form: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in rows:
        by_form.setdefault(row[1].split(":", 1)[1], []).append(row)
    for form in FORMS:
        found = by_form.get(form, [])
        lines += [f"## `{form}`: {len(found)}", ""]
        if found:
            lines += ["| operator | sample | CUDA | emulated XPU | why |", "|---|---|---|---|---|"]
            lines += [
                f"| `{n}` | {k.split(':')[0]} | {a} | {b} | {by_design(n) or '**unexplained**'} |"
                for n, k, a, b in found
            ]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the samples on one device and write the outcomes as JSON")
    r.add_argument("--device", required=True, choices=("cuda", "xpu"))
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="list the cases where exactly one device ran the operator (exit 1: unexplained)")
    c.add_argument("reference", type=Path)
    c.add_argument("other", type=Path)
    c.add_argument("--report", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        import torch

        device_module = getattr(torch, args.device)
        if not device_module.is_available():
            print(f"opinfo_differential: no {args.device} device is available", file=sys.stderr)
            return 2
        outcomes = run(args.device)
        meta = {"device": args.device, "torch": torch.__version__, "name": device_module.get_device_name(0)}
        args.out.write_text(json.dumps({"meta": meta, "outcomes": outcomes}, indent=0, sort_keys=True))
        print(f"opinfo_differential: {sum(len(v) for v in outcomes.values())} cases of {len(outcomes)} operators")
        return 0
    ref, other = json.loads(args.reference.read_text()), json.loads(args.other.read_text())
    rows = compare(ref["outcomes"], other["outcomes"])
    meta = {
        "reference": f"{ref['meta']['name']}, torch {ref['meta']['torch']}",
        "other": f"{other['meta']['name']}, torch {other['meta']['torch']}",
    }
    args.report.write_text(_report(rows, ref["outcomes"], other["outcomes"], meta) + "\n")
    unexplained = sum(by_design(row[0]) is None for row in rows)
    print(f"opinfo_differential: {len(rows)} differences, {unexplained} unexplained; report in {args.report}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
