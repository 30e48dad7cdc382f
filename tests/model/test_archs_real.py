"""Every architecture test-llama-archs writes, loaded by the real pinned llama-completion / llama-server in
several configurations: each KV and recurrent cache line equals the prediction, or the architecture is
listed as unmodelled and the prediction errs the way its note says."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.model.arch import ARCHITECTURES, UNMODELLED
from tests.arch_corpus import CONFIGS, architecture_of, clean_env, compare_all, generate_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> list[Path]:
    if not (llama_bin / "test-llama-archs").is_file():
        pytest.fail("test-llama-archs not built: run scripts/build-llama.sh cpu")
    return generate_corpus(llama_bin, tmp_path_factory.mktemp("archs"))


@pytest.mark.slow
def test_every_architecture_is_known(corpus: list[Path]) -> None:
    archs = {architecture_of(model) for model in corpus}
    assert len(archs) > 100, sorted(archs)
    unknown = sorted(a for a in archs if a not in ARCHITECTURES and a not in UNMODELLED)
    assert not unknown, f"llama.cpp writes architectures safe-llama has no rule for: {unknown}"


@pytest.mark.slow
def test_every_cache_predicted_or_error_direction_named(corpus: list[Path], llama_bin: Path) -> None:
    outcomes = compare_all(llama_bin, corpus, clean_env())
    assert len(outcomes) == len(corpus) * len(CONFIGS)
    problems = []
    for o in outcomes:
        problem = o.problem()
        if problem is not None:
            problems.append(
                f"{o.model} [{o.config}]: {problem}\n  seen      {list(o.seen)}\n  predicted {list(o.predicted)}"
                + (f"\n  log tail: {o.log_tail}" if o.log_tail else "")
            )
    assert not problems, "\n".join(problems)
    # the exact ones are most of the corpus: a comparison that matched nothing would prove nothing
    exact = sum(o.exact for o in outcomes)
    assert exact >= 0.9 * len(outcomes)
    refused = [f"{o.model} [{o.config}]" for o in outcomes if o.refused]
    assert len(refused) < 0.05 * len(outcomes), refused
