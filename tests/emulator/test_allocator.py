"""The caching allocator model: block and segment rounding, caching, empty_cache, out-of-memory."""

from __future__ import annotations

import json
import re

MiB = 2**20


def test_reserved_segments_cache_and_empty_cache(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.xpu.init()
        r = {}
        def books():
            return [torch.xpu.memory_allocated(), torch.xpu.memory_reserved()]
        a = torch.empty(3, device="xpu")                    # 12 bytes: one 512-byte block of a 2 MiB segment
        r["small"] = books()
        b = torch.empty(5 * 2**20, dtype=torch.uint8, device="xpu")   # a 20 MiB segment
        c = torch.empty(21 * 2**20, dtype=torch.uint8, device="xpu")  # too big for b's rest: 22 MiB, unsplit
        r["large"] = books()
        d = torch.empty(3 * 2**20, dtype=torch.uint8, device="xpu")   # carved out of b's segment
        stats = torch.xpu.memory_stats()
        r["segments"] = [stats["segment.all.current"], stats["segment.large_pool.current"]]
        r["split"] = [stats["inactive_split.large_pool.current"], stats["inactive_split_bytes.large_pool.current"]]
        del a, b, c, d
        r["freed"] = books()                                # freed blocks stay cached
        torch.xpu.empty_cache()
        r["emptied"] = books()
        r["groups"] = sorted({k.split(".")[0] for k in torch.xpu.memory_stats() if "." in k})
        print(json.dumps(r))
        """
    )
    r = json.loads(out)
    assert r["small"] == [512, 2 * 2**20]
    assert r["large"] == [512 + 5 * 2**20 + 22 * 2**20, 2 * 2**20 + 20 * 2**20 + 22 * 2**20]
    assert r["segments"] == [3, 2]
    assert r["split"] == [1, 12 * 2**20]                   # 20 MiB - 5 MiB - 3 MiB left in b's segment
    assert r["freed"] == [0, 44 * 2**20]
    assert r["emptied"] == [0, 0]
    assert r["groups"] == [
        "active", "active_bytes", "allocated_bytes", "allocation", "inactive_split", "inactive_split_bytes",
        "requested_bytes", "reserved_bytes", "segment",
    ]


def test_out_of_memory_counts_reserved_segments(run_emulated):
    out = run_emulated(
        """
        import json, torch
        torch.xpu.set_per_process_memory_fraction(24 * 2**20 / (64 * 2**30))   # 24 MiB allowed on a 64 GiB stack
        keep = torch.empty(1, device="xpu")                             # 2 MiB segment
        big = torch.empty(12 * 2**20, dtype=torch.uint8, device="xpu")  # 12 MiB segment
        del big                                                         # cached: reserved stays at 14 MiB
        mid = torch.empty(13 * 2**20, dtype=torch.uint8, device="xpu")  # needs 14 MiB: frees the cached segment
        r = {"retried": [torch.xpu.memory_stats()["segment.all.current"], torch.xpu.memory_reserved()]}
        try:
            more = torch.empty(4 * 2**20, dtype=torch.uint8, device="xpu")   # a 20 MiB segment: 16 + 20 > 24 MiB
        except torch.OutOfMemoryError as e:
            r["oom"] = str(e)
        print(json.dumps(r))
        """
    )
    r = json.loads(out)
    assert r["retried"] == [2, 16 * MiB]                   # the cached 12 MiB segment went back
    assert re.fullmatch(
        r"XPU out of memory\. Tried to allocate 20\.00 MiB\. GPU 0 has a total capacity of 64\.00 GiB of which "
        r"63\.98 GiB is free\. 24\.00 MiB allowed; Of the allocated memory 14\.00 MiB is allocated by PyTorch, "
        r"and 2\.00 MiB is reserved by PyTorch but unallocated\. Please use `empty_cache` to release all "
        r"unoccupied cached memory\.",
        r["oom"],
    ), r["oom"]


def test_memory_reserve_is_never_allocatable(run_emulated):
    """LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE: what the driver and other processes keep of each device. The total
    capacity stays nominal; free memory and the allocator's limit leave the reserve out."""
    out = run_emulated(
        """
        import json, torch
        torch.xpu.init()
        r = {"info": list(torch.xpu.mem_get_info()), "props": torch.xpu.get_device_properties().total_memory}
        fits = torch.empty(60 * 2**20, dtype=torch.uint8, device="xpu")
        r["after"] = torch.xpu.mem_get_info()[0]
        try:
            torch.empty(6 * 2**20, dtype=torch.uint8, device="xpu")
        except torch.OutOfMemoryError as e:
            r["oom"] = str(e)
        print(json.dumps(r))
        """,
        devices=1,
        profile="arc-a770",
        env={"LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE": "16320M"},  # 16 GiB - 64 MiB: 64 MiB usable
    )
    r = json.loads(out)
    assert r["info"] == [64 * MiB, 16 * 2**30]
    assert r["props"] == 16 * 2**30
    assert r["after"] == 4 * MiB
    assert r["oom"].startswith(
        "XPU out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 16.00 GiB of which 4.00 MiB "
        "is free."
    )


def test_no_memory_reserve_by_default(run_emulated):
    out = run_emulated("import torch; print(*torch.xpu.mem_get_info(1))", profile="b580")
    assert out.split() == [str(12 * 2**30)] * 2


def test_bad_memory_reserve_stops_start_up(run_emulated):
    out = run_emulated(
        """
        import subprocess, sys, os
        os.environ["LIGHTNING_XPU_EMULATOR_DEVICE"] = "arc-a770"
        for value in ("lots", "1.5G", "-1", "16G", "2T"):
            env = dict(os.environ, LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE=value)
            p = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
            print(p.returncode, p.stderr.strip().splitlines()[-1])
        """,
        devices=1,
    )
    for line, value in zip(out.splitlines(), ("lots", "1.5G", "-1", "16G", "2T"), strict=True):
        assert line.startswith("1 "), line
        assert (
            "LIGHTNING_XPU_EMULATOR_MEMORY_RESERVE must be a whole number of bytes, optionally with K, M or G (binary "
            f"units: 512M, 2G), below the memory of one arc-a770 device (16 GiB), got '{value}'."
        ) in line


def test_mem_pool_keeps_its_own_cache_until_released(run_emulated):
    # torch.xpu.MemPool / use_mem_pool (2.11+): allocations inside the context take segments of the pool's own,
    # which empty_cache() leaves while a MemPool holds the pool, and which go when the last MemPool goes
    out = run_emulated(
        """
        import json, threading, torch
        torch.xpu.empty_cache()
        pool = torch.xpu.MemPool()
        ids = []
        threads = [threading.Thread(target=lambda: ids.append(torch.xpu.MemPool().id)) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        r = {"id": pool.id[0], "unique": len({pool.id, *ids}), "count": pool.use_count()}
        x = torch.empty(1024, 1024, device="xpu")      # 4 MiB: a 20 MiB segment of the device's cache
        with torch.xpu.use_mem_pool(pool):
            r["inside"] = pool.use_count()
            y = torch.empty(1024, 1024, device="xpu")  # another 20 MiB segment: the pool's own
        r["after"] = pool.use_count()
        del x, y
        r["reserved"] = torch.xpu.memory_reserved() >> 20
        torch.xpu.empty_cache()
        r["held"] = torch.xpu.memory_reserved() >> 20
        z = torch.empty(1024, 1024, device="xpu")      # outside the context: not from the pool's cache
        r["outside"] = torch.xpu.memory_reserved() >> 20
        del z, pool
        r["released"] = torch.xpu.memory_reserved() >> 20
        print(json.dumps(r))
        """
    )
    assert json.loads(out) == {
        "id": 0, "unique": 5, "count": 1, "inside": 2, "after": 1,
        "reserved": 40, "held": 20, "outside": 40, "released": 20,
    }


def test_mem_pool_is_absent_before_2_11(run_emulated):
    out = run_emulated(
        "import torch; print(hasattr(torch.xpu, 'MemPool'), hasattr(torch.xpu, 'use_mem_pool'))",
        env={"LIGHTNING_XPU_EMULATOR_TORCH": "2.10"},
    )
    assert out.split() == ["False", "False"]
