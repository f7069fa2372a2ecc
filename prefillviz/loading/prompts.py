"""Preset prompts and a deterministic long text for benchmarks (N tokens of real prose)."""

from __future__ import annotations

BENCH_TEXT = (
    "Prefill is the first phase of inference for a large language model. The model reads the whole "
    "prompt in one forward pass, computes keys and values for every token in every layer, stores them "
    "in the KV cache, and produces a probability distribution over the next token. Because all prompt "
    "tokens are known in advance, the work is done as large matrix multiplications that keep the "
    "compute units busy. Decode then generates one token at a time, reading the cache it filled. "
)


def bench_token_ids(tokenizer, num_tokens: int) -> list[int]:
    """Exactly ``num_tokens`` token ids of real prose (the text repeated as needed)."""
    unit = tokenizer(BENCH_TEXT)["input_ids"]
    repeats = -(-num_tokens // len(unit))
    return (unit * repeats)[:num_tokens]

_DOCUMENT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, an oil-based ink and a screw press adapted from wine making. Before him, books were "
    "copied by hand, and a single Bible could take a scribe more than a year. Within fifty years of his first "
    "prints, presses were running in more than two hundred European cities, and millions of books had been "
    "made. Prices fell, literacy rose, and ideas travelled faster than any ruler could follow. Scholars could "
    "compare identical copies of the same text, which made footnotes, indexes and errata possible. Printers "
    "standardized spelling and punctuation, and national languages grew at the expense of Latin. The press "
    "also carried pamphlets, news sheets and maps, and by the seventeenth century the first newspapers "
    "appeared in Strasbourg and Antwerp. Historians still argue about how much the press caused and how much "
    "it only accelerated, but few doubt that the way knowledge was stored and shared changed for good.\n\n"
    "Railways brought a second revolution in the nineteenth century. Steam locomotives cut journeys that had "
    "taken days by coach to a few hours, and towns agreed on a common time so that timetables could work. "
    "Fresh food reached cities from distant farms, factories found national markets, and people began to "
    "travel for pleasure. Engineers built viaducts, tunnels and stations that still stand today, and the "
    "telegraph lines laid beside the tracks carried messages faster than any train.\n\n"
)

PRESETS = {
    "Short question": "The capital of France is",
    "Chat with a system prompt": (
        "<|im_start|>system\nYou are a patient teacher who explains computer science to high-school students "
        "in short, clear answers.<|im_end|>\n<|im_start|>user\nWhy does a language model answer faster after "
        "it has read my question once?<|im_end|>\n<|im_start|>assistant\n"
    ),
    "Long document": _DOCUMENT * 3 + "Summary of the text above in one sentence:",
    "Code": (
        "def merge_sorted(left, right):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
        "    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
        "        if left[i] <= right[j]:\n            result.append(left[i])\n            i += 1\n"
        "        else:\n            result.append(right[j])\n            j += 1\n"
    ),
}
"""Prompts the app offers as presets: a short question, a chat with a system prompt (ChatML,
SmolLM2's format), a long document (~1,000 tokens) and code."""
