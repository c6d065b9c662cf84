from x_transformers.x_transformers import (
    XTransformer,
    Encoder,
    Decoder,
    PrefixDecoder,
    CrossAttender,
    AttentionPool,
    Attention,
    FeedForward,
    RMSNorm,
    AdaptiveRMSNorm,
    TransformerWrapper,
    ViTransformerWrapper,
    TransformerBlock,
    layer_schedule
)

from x_transformers.autoregressive_wrapper import AutoregressiveWrapper
from x_transformers.nonautoregressive_wrapper import NonAutoregressiveWrapper
from x_transformers.belief_state_wrapper import BeliefStateWrapper
from x_transformers.next_latent_wrapper import NextLatentWrapper

from x_transformers.continuous import (
    ContinuousTransformerWrapper,
    ContinuousAutoregressiveWrapper
)

from x_transformers.multi_input import MultiInputTransformerWrapper

from x_transformers.xval import (
    XValTransformerWrapper,
    XValAutoregressiveWrapper
)

from x_transformers.xl_autoregressive_wrapper import XLAutoregressiveWrapper

from x_transformers.dpo import (
    DPO
)

from x_transformers.neo_mlp import (
    NeoMLP
)

from x_transformers.entropy_based_tokenizer import EntropyBasedTokenizer
