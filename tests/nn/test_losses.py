import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.losses import linear_cross_entropy


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_equals_pytorch_cross_entropy(label_smoothing, with_bias, device):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 37, 24, generator=g, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(53, 24, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(53, generator=g, dtype=torch.float64).to(device).requires_grad_() if with_bias else None
    y = torch.randint(0, 53, (2, 37), generator=g)
    y[0, ::5] = -100
    y = y.to(device)
    fused = linear_cross_entropy(h, w, y, b, label_smoothing=label_smoothing, chunk_rows=16)
    ref = F.cross_entropy(F.linear(h, w, b).reshape(-1, 53), y.reshape(-1), label_smoothing=label_smoothing)
    params = [h, w] + ([b] if with_bias else [])
    g1 = torch.autograd.grad(3 * fused, params)
    g2 = torch.autograd.grad(3 * ref, params)
    torch.testing.assert_close(fused.double(), ref, rtol=1e-6, atol=1e-6)
    for a, c in zip(g1, g2):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-8)


def test_fused_loss_under_bf16_autocast_is_close(device):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=g).to(device)
    w = (torch.randn(100, 32, generator=g) * 0.1).to(device)
    y = torch.randint(0, 100, (64,), generator=g).to(device)
    ref = F.cross_entropy(h @ w.t(), y)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, y)
    assert fused.dtype == torch.float32
    assert abs(fused.item() - ref.item()) < 0.02


def test_no_grad_path_and_errors():
    h, w, y = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, 3, -100])
    with torch.no_grad():
        out = linear_cross_entropy(h, w, y)
    torch.testing.assert_close(out, F.cross_entropy(h @ w.t(), y))
    with pytest.raises(ValueError, match="rows"):
        linear_cross_entropy(h, w, y[:3])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_fused_loss_in_cache_sized_blocks_equals_pytorch(monkeypatch, label_smoothing, device):
    # several row chunks, each split into softmax blocks (of 3 rows here), with a bias
    from attnlab.nn import losses

    monkeypatch.setattr(losses, "_SOFTMAX_BLOCK_BYTES", 3 * 41 * 4)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(29, 16, generator=g, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(41, 16, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(41, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = torch.randint(0, 41, (29,), generator=g)
    y[::4] = -100
    y = y.to(device)
    for chunk_rows in (None, 10):
        fused = linear_cross_entropy(h, w, y, b, label_smoothing=label_smoothing, chunk_rows=chunk_rows)
        ref = F.cross_entropy(F.linear(h, w, b), y, label_smoothing=label_smoothing)
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10)
        for a, c in zip(torch.autograd.grad(fused, [h, w, b]), torch.autograd.grad(ref, [h, w, b])):
            torch.testing.assert_close(a, c, rtol=1e-8, atol=1e-10)


def test_fused_loss_under_bf16_is_float32_cross_entropy_of_bf16_logits(monkeypatch, device):
    # under autocast the logits are a bf16 matmul (as in an unfused bf16 head); everything after
    # it (log-softmax, loss) is float32, so the loss matches that reference tightly
    from attnlab.nn import losses

    monkeypatch.setattr(losses, "_SOFTMAX_BLOCK_BYTES", 8 * 300 * 4)
    g = torch.Generator().manual_seed(2)
    h = torch.randn(50, 32, generator=g).to(device).requires_grad_()
    w = (torch.randn(300, 32, generator=g) * 0.3).to(device).requires_grad_()
    y = torch.randint(0, 300, (50,), generator=g).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, y, chunk_rows=16)
    logits = (h.bfloat16() @ w.bfloat16().t()).float()
    ref = F.cross_entropy(logits, y)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    gh, gw = torch.autograd.grad(fused, [h, w])
    rh, rw = torch.autograd.grad(F.cross_entropy(h @ w.t(), y), [h, w])  # float32 gradients
    for a, c in ((gh, rh), (gw, rw)):
        assert a.dtype == torch.float32
        assert (a - c).norm() / c.norm() < 0.02  # bf16 matmuls: about 3 significant digits


def test_chunk_rows_must_be_positive():
    h, w, y = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, 3, 4])
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(h, w, y, chunk_rows=0)


def test_backward_of_the_plain_loss_scales_no_vocabulary_sized_tensor():
    """`loss.backward()` sends a gradient of exactly 1: the stored gradients go back as they are
    (no (V, D) multiply); the gradients still equal PyTorch's, and a second backward over the
    retained graph gives the same ones again (nothing stored was changed in place)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class VocabSizedOps(TorchDispatchMode):
        def __init__(self, shape):
            super().__init__()
            self.shape, self.seen = shape, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and tuple(out.shape) == self.shape:
                self.seen.append(func.__name__)
            return out

    g = torch.Generator().manual_seed(3)
    h = torch.randn(30, 16, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(41, 16, generator=g, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, 41, (30,), generator=g)
    loss = linear_cross_entropy(h, w, y, chunk_rows=7)
    spy = VocabSizedOps((41, 16))
    with spy:
        first = torch.autograd.grad(loss, [h, w], retain_graph=True)
    assert spy.seen == []
    second = torch.autograd.grad(loss, [h, w])
    ref = torch.autograd.grad(F.cross_entropy(h @ w.t(), y), [h, w])
    for a, b, c in zip(first, second, ref):
        torch.testing.assert_close(a, c, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(b, c, rtol=1e-8, atol=1e-10)
