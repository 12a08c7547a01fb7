"""Sequence Fragment Puzzle: word shaping, fragments, and discovery of unknown words."""

from __future__ import annotations

import numpy as np
import pytest

from dp_governor.api.demo.simulation import made_up_words, zipf_indices
from dp_governor.mechanisms import SFP, HashFamily
from dp_governor.mechanisms.sfp import POSITIONS, fragment_item, normalize_word


def test_words_are_padded_or_truncated_to_ten_characters() -> None:
    assert normalize_word("bae") == "bae       "
    assert normalize_word("Mayweather") == "Mayweather"
    assert normalize_word("Despacito remix") == "Despacito "
    with pytest.raises(TypeError, match="str"):
        normalize_word(b"bytes")  # type: ignore[arg-type]


def test_fragment_is_the_puzzle_byte_then_two_characters() -> None:
    assert fragment_item(7, "ab") == b"\x07ab"
    assert len(fragment_item(255, "zz")) == 3


def test_reports_carry_a_uniform_public_position_and_total_epsilon() -> None:
    sfp = SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=16, m=64, k_fragment=16, m_fragment=64)
    assert sfp.epsilon == 8.0
    reports = sfp.privatize(["word"] * 50_000, rng=np.random.default_rng(0))
    counts = np.array([np.count_nonzero(reports.position == p) for p in POSITIONS])
    expected = 50_000 / 5
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected * 0.8))
    assert sfp.privatize_one("word").position in POSITIONS


def test_fragment_reports_encode_the_fragment_at_their_position() -> None:
    # With epsilon huge the report is (nearly) deterministic: decode the one-hot bucket.
    sfp = SFP(epsilon_word=60.0, epsilon_fragment=60.0, k=4, m=256, k_fragment=4, m_fragment=256)
    word = "hello"
    reports = sfp.privatize([word] * 20, rng=np.random.default_rng(1))
    piece = int(sfp.puzzle([word])[0])
    norm = normalize_word(word)
    for r in reports:
        bucket = int(np.flatnonzero(r.fragment.signs(256) == 1)[0])
        item = fragment_item(piece, norm[r.position : r.position + 2])
        assert bucket == sfp.fragment_cms.hash_family.hash([item], [r.fragment.j], 256)[0]


def test_planted_word_is_recovered_and_every_proposal_is_puzzle_consistent() -> None:
    sfp = SFP(epsilon_word=2.0, epsilon_fragment=6.0, hash_family=HashFamily(5))
    rng = np.random.default_rng(2)
    noise = made_up_words(300, rng=rng)
    words = ["bruh"] * 60_000 + list(rng.choice(noise, 40_000))
    found = sfp.sketch().add(sfp.privatize(words, rng=rng)).discover_detailed()
    assert found and found[0].word == "bruh"
    for d in found:
        assert int(sfp.puzzle([d.word])[0]) == d.puzzle
        assert "".join(d.fragments) == normalize_word(d.word)


@pytest.mark.parametrize("top_fragments", [0, -1])
def test_discover_validates_arguments(top_fragments: int) -> None:
    sfp = SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=8, m=64, k_fragment=8, m_fragment=64)
    with pytest.raises(ValueError, match="`top_fragments`"):
        sfp.sketch().discover(top_fragments=top_fragments)


def test_empty_sketch_discovers_nothing() -> None:
    sfp = SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=8, m=64, k_fragment=8, m_fragment=64)
    assert sfp.sketch().discover(threshold=1.0) == []


def test_recovers_the_top_ten_of_an_unknown_zipf_vocabulary_at_apple_parameters() -> None:
    rng = np.random.default_rng(2017)
    vocabulary = made_up_words(5000, rng=rng)
    n = 1_000_000
    index = zipf_indices(len(vocabulary), n, 1.1, rng=rng)
    truth = np.bincount(index, minlength=len(vocabulary))
    sfp = SFP(
        epsilon_word=2.0,
        epsilon_fragment=6.0,
        k=2048,
        m=1024,
        k_fragment=2048,
        m_fragment=1024,
        hash_family=HashFamily(77),
    )
    sketch = sfp.sketch().add(sfp.privatize(np.asarray(vocabulary, dtype=object)[index], rng=rng))
    found = sketch.discover()
    words = [w for w, _ in found]
    top10 = [vocabulary[i] for i in np.argsort(-truth)[:10]]
    assert set(top10) <= set(words)
    # Every discovered word's estimate is consistent with the truth within 5 standard errors.
    by_word = {d.word: d for d in sketch.discover_detailed()}
    position = {w: i for i, w in enumerate(vocabulary)}
    for w in top10:
        d = by_word[w]
        assert abs(d.count - truth[position[w]]) < 5 * d.stderr
    # No false discoveries above the noise floor that are not real words.
    assert all(w in position for w in words)
