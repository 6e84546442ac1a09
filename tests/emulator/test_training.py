"""Training on emulated devices: loops, mixed precision, optimizers, checkpoints."""

from __future__ import annotations

import json

import pytest


def test_training_loop_matches_cpu(run_emulated):
    out = run_emulated(
        """
        import json, torch
        def train(device):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            g = torch.Generator().manual_seed(1)
            x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
            for _ in range(20):
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                opt.zero_grad(); loss.backward(); opt.step()
            return [p.detach().cpu() for p in model.parameters()], loss.item(), model[0].weight.grad.device
        cpu, cpu_loss, _ = train("cpu")
        xpu, xpu_loss, grad_device = train("xpu:1")
        print(json.dumps([all(torch.equal(a, b) for a, b in zip(cpu, xpu)), cpu_loss == xpu_loss, str(grad_device)]))
        """
    )
    assert json.loads(out) == [True, True, "xpu:1"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_really_casts(run_emulated, dtype):
    out = run_emulated(
        f"""
        import json, torch
        lin = torch.nn.Linear(4, 4).to("xpu")
        x = torch.randn(2, 4, device="xpu")
        with torch.autocast("xpu", dtype=torch.{dtype}):
            y = lin(x)
            s = y.float().softmax(-1)
        y.float().sum().backward()
        print(json.dumps([str(y.dtype), str(y.device), str(s.dtype), str(lin.weight.grad.dtype)]))
        """
    )
    assert json.loads(out) == [f"torch.{dtype}", "xpu:0", "torch.float32", "torch.float32"]


def test_grad_scaler_steps_and_skips_on_inf(run_emulated):
    out = run_emulated(
        """
        import json, torch
        lin = torch.nn.Linear(4, 1).to("xpu")
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("xpu", init_scale=2.0**10)
        x = torch.randn(8, 4, device="xpu")
        with torch.autocast("xpu", dtype=torch.float16):
            loss = lin(x).float().pow(2).mean()
        before = lin.weight.detach().clone()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        stepped = not torch.equal(before, lin.weight)
        scale_after_good = scaler.get_scale()
        opt.zero_grad()
        before = lin.weight.detach().clone()
        (lin(x).sum() * float("inf")).backward()
        scaler.step(opt); scaler.update()
        skipped = torch.equal(before, lin.weight)
        print(json.dumps([stepped, scale_after_good, skipped, scaler.get_scale(), str(scaler._scale.device)]))
        """
    )
    assert json.loads(out) == [True, 1024.0, True, 512.0, "xpu:0"]


@pytest.mark.parametrize(
    "kwargs", [{"foreach": False}, {"foreach": True}, {"fused": True}], ids=["for-loop", "foreach", "fused"]
)
@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_optimizers_match_cpu(run_emulated, optimizer, kwargs):
    out = run_emulated(
        f"""
        import json, torch
        def run(device):
            torch.manual_seed(0)
            lin = torch.nn.Linear(6, 3).to(device)
            opt = torch.optim.{optimizer}(lin.parameters(), lr=0.01, **{kwargs!r})
            x = torch.randn(5, 6).to(device)
            for _ in range(3):
                opt.zero_grad(); lin(x).pow(2).sum().backward(); opt.step()
            return lin.weight.detach().cpu()
        print(json.dumps(torch.allclose(run("cpu"), run("xpu"), atol=1e-6)))
        """
    )
    assert json.loads(out) is True


def test_checkpoint_round_trips_are_bitwise_exact(run_emulated, tmp_path):
    out = run_emulated(
        f"""
        import copy, json, torch
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3).to("xpu:1")
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 5, device="xpu:1")).sum().backward(); opt.step()
        view = model.weight[1]
        state = {{"model": model.state_dict(), "opt": opt.state_dict(), "view": view, "bf16": model.weight.bfloat16()}}
        torch.save(state, {str(tmp_path / "ckpt.pt")!r})
        on_cpu = torch.load({str(tmp_path / "ckpt.pt")!r}, map_location="cpu")
        on_xpu = torch.load({str(tmp_path / "ckpt.pt")!r})
        ok = [on_cpu["model"]["weight"].device.type == "cpu", str(on_xpu["model"]["weight"].device)]
        ok.append(torch.equal(on_cpu["model"]["weight"], model.weight.detach().cpu()))
        ok.append(torch.equal(on_cpu["bf16"], model.weight.detach().bfloat16().cpu()))
        ok.append(torch.equal(on_xpu["opt"]["state"][0]["exp_avg"].cpu(), opt.state[model.weight]["exp_avg"].cpu()))
        ok.append(on_cpu["view"].untyped_storage().data_ptr() == on_cpu["model"]["weight"].untyped_storage().data_ptr())
        cpu_state = {{k: v.cpu() for k, v in model.state_dict().items()}}
        torch.save(cpu_state, {str(tmp_path / "cpu.pt")!r})
        back = torch.load({str(tmp_path / "cpu.pt")!r}, map_location="xpu:0")
        ok.append(str(back["weight"].device))
        ok.append(torch.equal(back["weight"].cpu(), cpu_state["weight"]))
        clone = copy.deepcopy(model)
        ok.append(str(clone.weight.device))
        ok.append(torch.equal(clone.weight.cpu(), model.weight.cpu()))
        ok.append(clone.weight.data_ptr() != model.weight.data_ptr())
        print(json.dumps(ok))
        """
    )
    assert json.loads(out) == [True, "xpu:1", True, True, True, True, "xpu:0", True, "xpu:1", True, True]


def test_convolution_attention_and_recurrent_layers_match_cpu(run_emulated):
    out = run_emulated(
        """
        import json, torch
        import torch.nn.functional as F

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(4, 6, 3, padding=1, groups=2)
                self.up = torch.nn.ConvTranspose2d(6, 4, 2, stride=2)
                self.attn = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
                self.lstm = torch.nn.LSTM(8, 6, num_layers=2, bidirectional=True, batch_first=True)
                self.gru = torch.nn.GRU(12, 4, batch_first=True)

            def forward(self, x, q):
                y = self.up(torch.relu(self.conv(x)))
                a = self.attn(F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).flatten(2))
                r, _ = self.gru(self.lstm(a)[0])
                return y.sum() + r.pow(2).sum()

        def run(device):
            torch.manual_seed(0)
            net = Net().to(device)
            x, q = torch.randn(2, 4, 6, 6), torch.randn(2, 2, 5, 4)
            net(x.to(device), q.to(device)).backward()
            return [p.grad.cpu() for p in net.parameters()], str(net.conv.weight.grad.device)

        cpu, _ = run("cpu")
        xpu, device = run("xpu:1")
        print(json.dumps([len(cpu), all(torch.allclose(a, b, atol=1e-5) for a, b in zip(cpu, xpu)), device]))
        """
    )
    count, match, device = json.loads(out)
    assert count > 10 and match and device == "xpu:1"
