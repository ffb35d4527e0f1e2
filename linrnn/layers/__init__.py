"""Token-mixing layers on top of the ops: ``[B, T, D]`` in and out, any dtype and device.

Every layer takes ``forward(x, attention_mask=None, cache=None)``: the optional mask
``[B, T]`` (1 = token, 0 = padding, left or right) is turned into packed sequences
(``cu_seqlens``), and the optional :class:`Cache` carries the recurrent state for decoding
(a prompt, then one token at a time, gives what one call over the whole sequence gives).
"""

from linrnn.layers.common import Cache, HeadNorm, Mixer, Packing, RMSNorm
from linrnn.layers.conv import ShortConvolution
from linrnn.layers.delta_net import DeltaNet, GatedDeltaNet
from linrnn.layers.gla import GatedLinearAttention
from linrnn.layers.linear_attention import LinearAttention
from linrnn.layers.mamba2 import Mamba2
from linrnn.layers.mlstm import mLSTMLayer
from linrnn.layers.retention import MultiScaleRetention
from linrnn.layers.rwkv6 import RWKV6TimeMix
from linrnn.layers.simple_gla import SimpleGLA
from linrnn.layers.softmax_attention import SoftmaxAttention

__all__ = [
    "Cache",
    "DeltaNet",
    "GatedDeltaNet",
    "GatedLinearAttention",
    "HeadNorm",
    "LinearAttention",
    "Mamba2",
    "Mixer",
    "MultiScaleRetention",
    "Packing",
    "RMSNorm",
    "RWKV6TimeMix",
    "ShortConvolution",
    "SimpleGLA",
    "SoftmaxAttention",
    "mLSTMLayer",
]
