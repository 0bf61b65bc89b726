"""Pieces shared by the seeded trace generators in this folder (Mooncake's JSONL format)."""
import argparse

TRACE_BLOCK = 512  # tokens per hash id in the Mooncake format


def int_range(text):
    """argparse type for "N" or "MIN:MAX" (1 <= MIN <= MAX); returns (lo, hi)."""
    lo, _, hi = text.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"'{text}': want N or MIN:MAX with 1 <= MIN <= MAX")
    return lo, hi
