"""The inference layout of a Linear (one column block per thread) equals nn.Linear for any row
count, and `project` keeps the module's own call where the layout must not apply."""

import pytest
import torch
from torch import nn

from attnlab.nn.linear import InferenceLayout, fixed_layouts, project, project_few_rows


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_layout_blocks_equal_nn_linear_for_any_row_count(threads):
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(threads)
    try:
        torch.set_num_threads(threads)
        for n_out in (12, 13):  # 13: not divisible by 2 or 3 -> one block
            weight, bias = torch.randn(n_out, 8, generator=g), torch.randn(n_out, generator=g)
            for b in (bias, None):
                m = InferenceLayout(weight, b)
                assert m.blocks == (threads if n_out % threads == 0 else 1)
                for rows in (1, 3, 16):
                    x = torch.randn(rows, 8, generator=g)
                    torch.testing.assert_close(m(x), torch.nn.functional.linear(x, weight, b), rtol=1e-6, atol=1e-6)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bias", [True, False])
def test_project_equals_the_module_and_keeps_autograd_and_hooks(bias):
    lin = nn.Linear(8, 40, bias=bias)
    x = torch.randn(5, 8)
    with torch.no_grad():
        for rows in (1, 4, 5):
            torch.testing.assert_close(project(lin, x[:rows]), lin(x[:rows]), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(project_few_rows(lin, x[:rows]), lin(x[:rows]), rtol=1e-6, atol=1e-6)
            assert project_few_rows(lin, x[:rows]).is_contiguous()
    assert project(lin, x).requires_grad  # autograd on: the module's call
    lin.register_forward_hook(lambda module, args, out: out * 2)
    with torch.no_grad():
        torch.testing.assert_close(project(lin, x), 2 * torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_fixed_layouts_are_checked_on_entry_and_per_call_again_after_exit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        model[0].weight.mul_(2)  # changed before the block: the layout taken on entry sees it
        with fixed_layouts(model):
            torch.testing.assert_close(project(model[0], x), model[0](x))
            torch.testing.assert_close(project(model[1], project(model[0], x)), model(x))
        model[0].weight.add_(1)  # changed after the block: the per-call check rebuilds the layout
        torch.testing.assert_close(project(model[0], x), model[0](x))
