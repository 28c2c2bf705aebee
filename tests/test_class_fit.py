"""Class fit (tasks/generation/class_fit.py): a document that reads as another class than its seed's, by the naive
Bayes of the generation's released seeds, is asked again and passed over, never dropped."""
import pytest

from privseed.tasks.generation.class_fit import SeedClasses, seed_classes
from privseed.tasks.generation.drivers import generate_seeds, generate_shard
from privseed.tasks.generation.params import GenerationParams
from privseed.tasks.generation.rounds import candidate_seed, select_best, steering_for
from privseed.tasks.generation.rows import split_documents
from privseed.tasks.llm import ReleasedVocabulary, register_backend
from privseed.tasks.llm.base import ChatResult
from tests.fakes.recording import RecordingBackend

SPEC = "local:class-fit-test"
# Two classes with their own words: a doctor's office and a restaurant.
VOCAB = ReleasedVocabulary(["doctor", "nurse", "clinic", "appointment", "pasta", "waiter", "dessert", "menu"],
                           "test")
CLINIC, FOOD = [0, 1, 2, 3], [4, 5, 6, 7]
ON_CLASS = "The doctor and the nurse at this clinic saw me on time for my appointment, and the doctor was kind."
OFF_CLASS = "The waiter brought the pasta and a dessert from the menu; the pasta was the best on the menu."


def seeds():
    """Two seeds a class, each of three of its class's words."""
    return [VOCAB.seed(CLINIC[:3], label="health", seed=1000), VOCAB.seed(CLINIC[1:], label="health", seed=1001),
            VOCAB.seed(FOOD[:3], label="food", seed=1002), VOCAB.seed(FOOD[1:], label="food", seed=1003)]


@pytest.fixture
def recording():
    backend = RecordingBackend()
    register_backend(SPEC, backend)
    yield backend
    register_backend(SPEC, None)


def test_the_seeds_naive_bayes_reads_a_text_as_the_class_its_seed_words_belong_to():
    classes = SeedClasses.from_seeds(seeds())
    assert classes.labels == ("health", "food")
    assert classes.reads_as(ON_CLASS) == "health" and classes.reads_as(OFF_CLASS) == "food"
    assert classes.fits(ON_CLASS, "health") and classes.fits(OFF_CLASS, "food")
    assert not classes.fits(OFF_CLASS, "health")
    # No seed word: no evidence, it fits every class; a label no seed has fits too
    assert classes.reads_as("A quiet afternoon.") is None and classes.fits("A quiet afternoon.", "health")
    assert classes.fits(OFF_CLASS, "a label with no seed")
    # A tie fits both classes: one word of each
    tie = "the doctor ordered the pasta"
    assert classes.fits(tie, "health") and classes.fits(tie, "food")
    # Words of a multi-word seed term count one by one; case does not matter
    multi = ReleasedVocabulary(["heart surgery", "wine list"], "t")
    two = SeedClasses.from_seeds([multi.seed([0], label="a", seed=1), multi.seed([1], label="b", seed=2)])
    assert two.reads_as("Before the SURGERY ...") == "a" and two.reads_as("The list of wines") == "b"


def test_one_class_or_the_option_off_gives_no_judge():
    assert SeedClasses.from_seeds(seeds()[:2]) is None
    assert seed_classes(seeds(), enabled=False) is None and seed_classes(seeds()) is not None


def test_a_pool_the_seeds_were_kept_from_judges_in_their_place(tmp_path, recording):
    """The naive Bayes of a larger pool (the histogram methods' ``--hist-seed-pool``) replaces the kept seeds' own:
    its word lists steer and its judge decides; the option off still gives no judge."""
    rows = [CLINIC[:3], CLINIC[1:], [0, 2, 3]] * 2 + [FOOD[:3], FOOD[1:], [4, 6, 7]] * 2
    pool = SeedClasses.from_phrases(["health"] * 6 + ["food"] * 6, [[VOCAB.terms[t] for t in r] for r in rows])
    assert pool is not None and pool.counts.sum() == 36
    assert SeedClasses.from_phrases([s.label for s in seeds()], [s.keyphrases for s in seeds()]).counts.tolist() == \
        SeedClasses.from_seeds(seeds()).counts.tolist()
    assert seed_classes(seeds(), True, pool) is pool and seed_classes(seeds(), False, pool) is None
    assert SeedClasses.from_seeds(seeds()).foreign_words("health") == ()  # two seeds a class: no word three times
    recording.answer = lambda req: ON_CLASS if req.seed in (1000, 1001) else OFF_CLASS
    generate_seeds(seeds(), SPEC, GenerationParams(doc_type="review", max_tokens=40), str(tmp_path), pool=pool,
                   progress=False)
    avoid = {req.seed: req.steering.avoid for req in recording.requests}
    assert set(avoid[1000]) == {"dessert", "menu", "pasta", "waiter"} and "clinic" in avoid[1002]


def test_select_best_keeps_the_document_that_reads_as_its_class_first():
    """Before coverage: the off-class candidate writes all three seed terms, the on-class one only one."""
    classes = SeedClasses.from_seeds(seeds())
    seed = seeds()[0]  # doctor, nurse, clinic
    off = ChatResult("At dinner the doctor, a nurse and a clinic friend had pasta; the waiter brought dessert, more "
                     "pasta and the menu, then the waiter's own dessert.", 1, 1)
    on = ChatResult("The doctor was kind, and she listened to every question before she answered it.", 1, 1)
    assert classes.reads_as(off.text) == "food"
    assert select_best(seed, [off, on], classes=classes) == (1, pytest.approx(1 / 3))
    assert select_best(seed, [off, on]) == (0, 1.0)  # without the judge: the most seed terms


def test_an_off_class_document_is_asked_again_and_passed_over_but_never_dropped(tmp_path, recording):
    """The health seeds' first answers are about a restaurant; their second one about the clinic (seed 1000) or
    about the restaurant again (seed 1001: every answer off its class, the row kept all the same)."""
    def answer(req):
        if req.seed == candidate_seed(1000, 0) or req.seed in [candidate_seed(1001, j) for j in range(5)]:
            return OFF_CLASS
        if req.seed in (1002, 1003):
            return OFF_CLASS  # the food seeds: on their class
        return ON_CLASS

    recording.answer = answer
    params = GenerationParams(doc_type="review", max_tokens=40, max_rewrites=2)
    rows = generate_shard(seeds(), SPEC, params, str(tmp_path / "a"), progress=False)
    assert rows["candidates"].tolist() == [2, 3, 1, 1]  # 1000: one rewrite; 1001: both rewrites; food: none
    assert rows["text"].tolist() == [ON_CLASS, OFF_CLASS, OFF_CLASS, OFF_CLASS]
    assert rows["document_reason"].isna().all() and rows["rejections"].map(len).tolist() == [0, 0, 0, 0]
    kept, report = split_documents(rows, params.max_regenerations, SeedClasses.from_seeds(seeds()))
    assert len(kept) == 4 and report["rows_read_as_another_class"] == 1  # seed 1001's row
    assert "rows_read_as_another_class" not in split_documents(rows, params.max_regenerations)[1]

    # --no-rewrite-off-class: one call a seed, the first answers kept
    recording.requests.clear()
    off = generate_shard(seeds(), SPEC, GenerationParams(doc_type="review", max_tokens=40, rewrite_off_class=False),
                         str(tmp_path / "b"), progress=False)
    assert off["candidates"].tolist() == [1, 1, 1, 1] and off["text"].tolist()[0] == OFF_CLASS


def test_the_judge_is_built_from_every_seed_of_the_generation_not_one_shard(tmp_path, recording):
    """One seed a shard: a shard alone holds one class and could judge nothing; the driver's judge sees both."""
    recording.answer = lambda req: OFF_CLASS if req.seed == candidate_seed(1000, 0) else (
        OFF_CLASS if req.seed in (1002, 1003) else ON_CLASS)
    rows = generate_seeds(seeds(), SPEC, GenerationParams(doc_type="review", max_tokens=40), str(tmp_path),
                          shard_size=1, progress=False)
    assert rows["candidates"].tolist() == [2, 1, 1, 1] and rows["text"].iloc[0] == ON_CLASS


def test_a_class_avoids_the_words_other_classes_seeds_hold_often_and_it_rarely():
    """The food seeds hold "waiter" and "dessert" twice, "pasta" and "menu" once; the health seeds none of them."""
    classes = SeedClasses.from_seeds(seeds())
    assert classes.foreign_words("health", min_count=2) == ("dessert", "waiter")  # ties: alphabetical
    assert classes.foreign_words("health", min_count=2, limit=1) == ("dessert",)
    assert classes.foreign_words("health") == ()  # at the default, three uses: none yet
    assert classes.foreign_words("food", min_count=2) == ("clinic", "nurse")
    assert classes.foreign_words("health", min_count=2, min_ratio=10.0) == ()  # 3 times as often, not 10
    assert classes.foreign_words("a label with no seed") == ()


def test_a_class_prefers_the_words_its_seeds_hold_often_and_the_others_rarely():
    """The health seeds hold "clinic" and "nurse" twice, the food seeds never: three times as likely (smoothed)."""
    classes = SeedClasses.from_seeds(seeds())
    assert classes.own_words("health", min_count=2) == ("clinic", "nurse")  # ties: alphabetical
    assert classes.own_words("health", min_count=2, limit=1) == ("clinic",)
    assert classes.own_words("health") == ()  # at the default, three uses: none yet
    assert classes.own_words("food", min_count=2) == ("dessert", "waiter")
    assert classes.own_words("health", min_count=2, min_ratio=4.0) == ()  # 3 times as likely, not 4
    assert classes.own_words("a label with no seed") == ()


def test_a_large_pools_word_lists_keep_words_held_by_one_seed_of_twenty():
    """In a pool of 100 seeds a class a word needs 5 uses (5 %), not 3: a noise word of one class's released terms
    is held a few times, alone in its class, and would otherwise lead the list."""
    health = [["doctor", "clinic"]] * 91 + [["nurse"]] * 5 + [["zeppelin"]] * 4
    food = [["pasta", "menu"]] * 95 + [["doctor"]] * 1 + [["rocket"]] * 4
    classes = SeedClasses.from_phrases(["health"] * 100 + ["food"] * 100, health + food)
    assert classes is not None and classes.rows.tolist() == [100, 100]
    assert classes.own_words("health") == ("clinic", "doctor", "nurse")  # not "zeppelin", held 4 times
    assert classes.foreign_words("health") == ("menu", "pasta")  # not "rocket"
    few = SeedClasses.from_phrases(["health"] * 20 + ["food"] * 20, health[-20:] + food[-20:])
    assert few is not None and "zeppelin" in few.own_words("health")  # 20 a class: three uses decide, as before


def test_local_decoding_prefers_the_own_classes_words_by_default_and_not_when_turned_off(tmp_path, recording):
    recording.answer = lambda req: ON_CLASS if req.seed in (1000, 1001) else OFF_CLASS
    more = seeds() + [VOCAB.seed(FOOD[1:], label="food", seed=1004)]  # "waiter" and "dessert" three times
    generate_shard(more, SPEC, GenerationParams(doc_type="review", max_tokens=40), str(tmp_path / "on"),
                   progress=False)
    prefer = {req.seed: req.steering.prefer for req in recording.requests}
    assert prefer[1002] == prefer[1004] == ("dessert", "waiter") and prefer[1000] == ()
    assert all(req.steering.params().get("prefer", list(req.steering.prefer)) == list(req.steering.prefer)
               for req in recording.requests)
    recording.requests.clear()
    generate_shard(more, SPEC, GenerationParams(doc_type="review", max_tokens=40, prefer_own_class=False),
                   str(tmp_path / "off"), progress=False)
    assert all(req.steering.prefer == () for req in recording.requests)
    assert all("prefer" not in req.steering.params() for req in recording.requests)  # cache keys as before


def test_local_decoding_avoids_the_other_classes_words_by_default_and_not_when_turned_off(tmp_path, recording):
    recording.answer = lambda req: ON_CLASS if req.seed in (1000, 1001) else OFF_CLASS
    more = seeds() + [VOCAB.seed(FOOD[1:], label="food", seed=1004)]  # "waiter" and "dessert" three times
    params = GenerationParams(doc_type="review", max_tokens=40)
    generate_shard(more, SPEC, params, str(tmp_path / "on"), progress=False)
    avoid = {req.seed: req.steering.avoid for req in recording.requests}
    assert avoid[1000] == avoid[1001] == ("dessert", "waiter")
    assert avoid[1002] == ()  # the health seeds hold no word three times
    # the shared server gets them too (its backend biases those that are one token: tests/test_llm_service.py)
    assert steering_for(more[0], params, "local-server", ("dessert",)).avoid == ("dessert",)
    recording.requests.clear()
    generate_shard(more, SPEC, GenerationParams(doc_type="review", max_tokens=40, avoid_other_classes=False),
                   str(tmp_path / "off"), progress=False)
    assert all(req.steering.avoid == () for req in recording.requests)
    assert all("avoid" not in req.steering.params() for req in recording.requests)  # cache keys as before
