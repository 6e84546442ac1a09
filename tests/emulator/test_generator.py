"""The emulated XPU generator: seed + offset state with the layout and semantics of torch's XPUGeneratorImpl."""

from __future__ import annotations

import json


def test_state_is_seed_and_offset(run_emulated):
    out = run_emulated(
        """
        import json, torch
        state = torch.xpu.get_rng_state()
        r = {"numel": state.numel(), "dtype": str(state.dtype), "device": str(state.device)}
        torch.xpu.manual_seed(5)
        seed, offset = torch.xpu.get_rng_state().view(torch.int64).tolist()
        r["after_seed"] = [seed, offset, torch.xpu.initial_seed()]
        torch.randn(10, device="xpu")
        r["after_randn"] = torch.xpu.get_rng_state().view(torch.int64).tolist()
        torch.rand(3, device="xpu")
        r["after_rand"] = torch.xpu.default_generators[0].get_offset()
        torch.xpu.manual_seed(5)
        r["reseeded"] = torch.xpu.default_generators[0].get_offset()
        g = torch.Generator(device="xpu:1")
        r["new"] = [g.initial_seed(), g.get_offset(), g.get_state().numel()]
        # default generators start from non-deterministic seeds, as on hardware
        r["default_seeds_differ"] = len({torch.xpu.default_generators[i].initial_seed() for i in range(2)}) == 2
        print(json.dumps(r))
        """
    )
    r = json.loads(out)
    assert r["numel"] == 16
    assert r["dtype"] == "torch.uint8"
    assert r["device"] == "cpu"
    assert r["after_seed"] == [5, 0, 5]
    seed, offset = r["after_randn"]
    assert seed == 5
    assert offset > 0
    assert offset % 4 == 0
    assert r["after_rand"] > offset
    assert r["after_rand"] % 4 == 0
    assert r["reseeded"] == 0
    assert r["new"] == [67280421310721, 0, 16]
    assert r["default_seeds_differ"]


def test_same_seed_and_offset_same_numbers(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.xpu.manual_seed(11)
        start = torch.xpu.get_rng_state()
        a = torch.randn(8, device="xpu")
        b = torch.randn(8, device="xpu")
        torch.xpu.set_rng_state(start)
        a2 = torch.randn(8, device="xpu")
        # the offset alone selects the numbers: jump to where `b` was drawn
        state = start.clone()
        state[8:] = torch.tensor([torch.xpu.get_rng_state().view(torch.int64)[1].item()]).view(torch.uint8)
        torch.xpu.set_rng_state(state)
        b2 = torch.randn(8, device="xpu")
        # a seed-only state (8 bytes) sets the offset to 0
        torch.xpu.set_rng_state(start[:8].clone())
        a3 = torch.randn(8, device="xpu")
        # an explicit generator follows the same rules
        g = torch.Generator(device="xpu").manual_seed(11)
        a4 = torch.randn(8, device="xpu", generator=g)
        g.set_offset(0)
        a5 = torch.randn(8, device="xpu", generator=g)
        print(json.dumps([torch.equal(a, a2), torch.equal(b, b2), torch.equal(a, b), torch.equal(a, a3),
                          torch.equal(a, a4), torch.equal(a, a5)]))
        """
    )
    assert json.loads(out) == [True, True, False, True, True, True]


def test_every_random_operator_draws_from_the_xpu_generator(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.manual_seed(0)
        torch.xpu.init()
        cpu_state = torch.get_rng_state()
        gen = torch.xpu.default_generators[0]
        advanced = {}
        ops = {
            "randperm": lambda: torch.randperm(6, device="xpu"),
            "dropout": lambda: torch.nn.functional.dropout(torch.ones(9, device="xpu"), 0.5),
            "bernoulli_": lambda: torch.empty(5, device="xpu").bernoulli_(0.5),
            "normal_": lambda: torch.empty(5, device="xpu").normal_(),
            "multinomial": lambda: torch.multinomial(torch.ones(4, device="xpu"), 2),
        }
        for name, op in ops.items():
            before = gen.get_offset()
            op()
            advanced[name] = gen.get_offset() - before
        # dropout is reproducible from the xpu state alone
        state = torch.xpu.get_rng_state()
        d1 = torch.nn.functional.dropout(torch.ones(64, device="xpu"), 0.5)
        torch.xpu.set_rng_state(state)
        d2 = torch.nn.functional.dropout(torch.ones(64, device="xpu"), 0.5)
        print(json.dumps([advanced, torch.equal(cpu_state, torch.get_rng_state()), torch.equal(d1, d2)]))
        """
    )
    advanced, cpu_untouched, dropout_repeats = json.loads(out)
    assert all(v > 0 and v % 4 == 0 for v in advanced.values()), advanced
    assert cpu_untouched
    assert dropout_repeats


def test_generator_errors_match_torch(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.xpu.init()
        errors = []
        def expect(fn):
            try:
                fn()
            except (RuntimeError, TypeError) as e:
                errors.append([type(e).__name__, str(e).splitlines()[0]])
            else:
                errors.append(None)
        expect(lambda: torch.xpu.set_rng_state(torch.zeros(5056, dtype=torch.uint8)))
        expect(lambda: torch.xpu.set_rng_state(torch.zeros(2, dtype=torch.int64)))
        expect(lambda: torch.xpu.default_generators[0].set_offset(6))
        expect(lambda: torch.randn(3, device="xpu", generator=torch.Generator()))
        print(json.dumps(errors))
        """
    )
    assert json.loads(out) == [
        ["RuntimeError", "RNG state is wrong size"],
        ["TypeError", "RNG state must be a torch.ByteTensor"],
        ["RuntimeError", "offset must be a multiple of 4"],
        ["RuntimeError", "Expected a 'xpu' device type for generator but found 'cpu'"],
    ]


def test_dtensor_rng_tracker_reads_the_state(run_emulated):
    out = run_emulated(
        """
        import json, torch
        from torch.distributed.tensor._random import _PhiloxState
        torch.xpu.manual_seed(3)
        torch.rand(5, device="xpu")
        state = _PhiloxState(torch.xpu.get_rng_state())
        state.offset = state.offset + 64
        torch.xpu.set_rng_state(state.state)
        print(json.dumps([int(state.seed), int(state.offset), torch.xpu.default_generators[0].get_offset()]))
        """
    )
    assert json.loads(out) == [3, 72, 72]
