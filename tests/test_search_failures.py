"""experiments/search_failures.py: the failure classes of a lost search episode."""

from experiments.search_failures import classify, second_query_class

SHOWN = ('<information>{"result": "Doc 1: \\"Vello Tremstov\\"\\nVello Tremstov is a sailor born in '
         'Garkel."}</information> <information>{"result": "Doc 1: \\"Garkel\\"\\nGarkel is a city '
         'in Vexaria."}</information>')


def test_a_near_copy_of_a_shown_gold_is_a_miscopy():
    assert classify("twohop", "Vexoria", "Vexaria", SHOWN, 2) == "miscopied"
    assert classify("onehop", "Garkal", "Garkel", SHOWN, 1) == "miscopied"


def test_another_shown_name_and_the_city_shortcut():
    assert classify("twohop", "Garkel", "Vexaria", SHOWN, 2) == "other name shown"
    assert classify("twohop", "Garkel", "Vexaria", SHOWN, 1) == "one search, name shown"
    # a one-hop question has no shortcut: one search is its plan
    assert classify("onehop", "Vexaria", "Garkel", SHOWN, 1) == "other name shown"


def test_names_never_shown_and_no_answer():
    assert classify("twohop", "Quiporia", "Vexaria", SHOWN, 2) == "name not shown"
    # a near copy of a gold that was never shown (a wrong second search) is not a miscopy
    assert classify("twohop", "Nesurio", "Nesuria", SHOWN, 2) == "name not shown"
    assert classify("twohop", None, "Vexaria", SHOWN, 4) == "no answer"


def test_the_second_query_against_the_persons_city():
    assert second_query_class(["Loyo Tremstov", "Ostduncor"], "Ostduncor") == "city"
    assert second_query_class(["Loyo Tremstov", "Ostcordun", "Ostcordun"], "Ostduncor") == "garbled city"
    assert second_query_class(["Loyo Tremstov", "Vexaria"], "Ostduncor") == "other"
    assert second_query_class(["Loyo Tremstov"], "Ostduncor") == "none"
    assert second_query_class(["Loyo", "Ostduncor"], None) == "unknown"
