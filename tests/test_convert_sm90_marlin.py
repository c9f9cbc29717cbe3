"""``sm90-marlin``'s refusals: the shapes the engines' Marlin MXFP4 path does not take, refused in one line, nothing written."""

import pytest

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import UnsupportedError
from moebake.reference.synthetic_sources import write_deepseek_v4
from moebake.synthetic import write_gpt_oss


def test_refuses_gpt_oss_whose_hidden_size_is_not_a_multiple_of_64(tmp_path):
    """SGLang's check_moe_marlin_supports_layer refuses H % 64 != 0, padded or not."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=160, intermediate=96, vocab=32)
    with pytest.raises(UnsupportedError) as refusal:
        convert(source, tmp_path / "out", ConvertOptions("sm90-marlin"), progress=False)
    assert "\n" not in str(refusal.value) and "hidden size 160 is not a multiple of 64" in str(refusal.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("hidden, intermediate", [(384, 128), (256, 96)])
def test_refuses_deepseek_v4_that_its_marlin_method_would_pad(tmp_path, hidden, intermediate):
    """Mxfp4MarlinMoEMethod rounds H up to 256 into uninitialised buffers and pads I to 64: not reproduced, refused."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, mtp_layers=0)
    with pytest.raises(UnsupportedError) as refusal:
        convert(source, tmp_path / "out", ConvertOptions("sm90-marlin"), progress=False)
    assert "\n" not in str(refusal.value) and "must be multiples of 256 and 64" in str(refusal.value)
    assert not (tmp_path / "out").exists()
