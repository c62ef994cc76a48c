"""Attention metadata: what one forward step tells every attention layer about the batch.

The batch is *flattened*: the query tokens of B sequences are concatenated into T rows; `query_start_loc`
says where each sequence's rows start. A step is either all-prefill (each sequence brings its uncached prompt
tokens) or all-decode (each brings one token).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CrossMetadata:
    """Encoder-decoder only: where each sequence's encoder K/V live in the cross pool."""

    encoder_seq_lens: torch.Tensor            # int32 [B]: encoder tokens of each sequence
    block_tables: torch.Tensor                # int32 [B, max_cross_blocks]
    # The context step (prefill) writes the cross K/V once; decode steps only read them.
    encoder_start_loc: torch.Tensor | None = None   # int32 [B+1] into the flattened encoder tokens
    slot_mapping: torch.Tensor | None = None        # int64 [T_enc]: cross-pool slot of each encoder token


@dataclass
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor        # int64 [T]: cache slot of each new token, -1 = do not write
    query_start_loc: torch.Tensor     # int32 [B+1]
    seq_lens: torch.Tensor            # int32 [B]: KV length of each sequence after this step
    block_tables: torch.Tensor        # int32 [B, max_blocks]
    max_query_len: int
    max_seq_len: int
    cross: CrossMetadata | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
