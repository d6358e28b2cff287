"""layup's chat-template renderer against transformers' own (render_jinja_template: jinja2 with
trim_blocks, lstrip_blocks and transformers' globals), byte for byte.

The model families' templates (those named in issue 44, and Qwen3's and Gemma 2's beside them)
are in data/chat_templates/ (its README says where they come from); each renders a set of
conversations on both sides: with and without a system message, several turns, the generation
prompt on and off, Unicode, empty content, text that looks like template syntax, a tool turn,
thinking turns, roles that do not alternate (Mistral and Llama 2 refuse them with
raise_exception: layup must refuse with the same message) and no messages at all. Small templates
below then pin the Jinja pieces one by one (whitespace control, scoping, filters, tests,
slicing). The C++ side runs through layup_chat_template_tool, once per file.
"""
import json
import pathlib
import random
import subprocess

import pytest

try:
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template
except ImportError:  # pragma: no cover
    pytest.skip("transformers and jinja2 are needed", allow_module_level=True)

from oracle_util import binary

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"

TOKENS = {
    "llama2": ("<s>", "</s>"), "mistral_v0_1": ("<s>", "</s>"), "mistral_v0_3": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"), "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2": ("", "<|im_end|>"), "qwen2_5": ("", "<|im_end|>"),
    "smollm": ("<|im_start|>", "<|im_end|>"), "smollm2": ("<|im_start|>", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"), "gemma2": ("<bos>", "<eos>"),
}


def turns(*pairs):
    return [{"role": role, "content": content} for role, content in pairs]


CONVERSATIONS = [
    turns(("user", "Hello!")),
    turns(("user", "What is 2+2?"), ("assistant", "4."), ("user", "And 3+3?"), ("assistant", "6.")),
    turns(("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello.")),
    turns(("system", "  padded system \n"), ("user", "  padded question\n\n"),
          ("assistant", "\tpadded answer  ")),
    turns(("user", "Grüße, 世界! 👋🏽 e\u0301 \u00a0nbsp\u3000ideographic"),
          ("assistant", "Ответ: ✓ — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢")),
    turns(("user", ""), ("assistant", "")),
    turns(("user", "Is {{ this }} {% raw %} text? {# no #}"), ("assistant", "Yes: {%- it -%} is.")),
    turns(("user", "line one\nline two\r\nline three"), ("assistant", "a\n\nb\n")),
    turns(("user", "call the tool"), ("assistant", "calling"), ("tool", "{\"result\": 42}"),
          ("user", "thanks")),
    turns(("user", "think"), ("assistant", "<think>\nsteps\n</think>\n\nanswer"), ("user", "again"),
          ("assistant", "<think>more</think>final")),
    turns(("user", "one"), ("user", "two")),
    turns(("assistant", "I speak first"), ("user", "ok")),
    turns(("system", "only a system message")),
    [],
]


def render_transformers(template, case):
    try:
        rendered, _ = render_jinja_template(
            conversations=[case["messages"]], chat_template=template,
            add_generation_prompt=case["add_generation_prompt"],
            bos_token=case["bos_token"], eos_token=case["eos_token"])
        return {"text": rendered[0]}
    except jinja2.exceptions.TemplateError as error:
        return {"error": str(error)}
    except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError) as error:
        return {"error": str(error)}


def render_layup(tmp_path, template_path, cases):
    cases_path, out_path = tmp_path / "cases.json", tmp_path / "out.json"
    cases_path.write_text(json.dumps(cases))
    subprocess.run([binary("layup_chat_template_tool"), str(template_path), str(cases_path),
                    str(out_path)], check=True, capture_output=True)
    return json.loads(out_path.read_text())


def check_same(expected, got, label):
    if "text" in expected:
        assert got == expected, f"{label}: layup {got!r}\n  transformers {expected!r}"
    else:
        assert "error" in got, f"{label}: transformers fails ({expected['error']}), layup gave {got!r}"


@pytest.mark.parametrize("family", sorted(TOKENS))
def test_family_templates_render_as_transformers(tmp_path, family):
    template_path = TEMPLATES / f"{family}.jinja"
    template = template_path.read_text()
    bos, eos = TOKENS[family]
    cases = [{"messages": messages, "bos_token": bos, "eos_token": eos,
              "add_generation_prompt": generation}
             for messages in CONVERSATIONS for generation in (False, True)]
    got = render_layup(tmp_path, template_path, cases)
    rendered = 0
    for case, result in zip(cases, got):
        expected = render_transformers(template, case)
        check_same(expected, result, f"{family} {case}")
        rendered += "text" in expected
    assert rendered >= 8, f"{family}: only {rendered} conversations rendered"


def test_role_alternation_is_refused_with_the_templates_message(tmp_path):
    messages = turns(("user", "one"), ("user", "two"))
    for family, phrase in [("mistral_v0_1", "conversation roles must alternate"),
                           ("mistral_v0_3", "conversation roles must alternate"),
                           ("llama2", "Conversation roles must alternate")]:
        case = {"messages": messages, "bos_token": "<s>", "eos_token": "</s>",
                "add_generation_prompt": False}
        expected = render_transformers((TEMPLATES / f"{family}.jinja").read_text(), case)
        assert phrase in expected["error"]
        got = render_layup(tmp_path, TEMPLATES / f"{family}.jinja", [case])[0]
        assert expected["error"] in got.get("error", ""), (family, got)


# Small templates, each one Jinja feature (or a few) against jinja2 as transformers sets it up.
PIECES = [
    # whitespace control, trim_blocks and lstrip_blocks
    "a  \n  {% if true %}\n  x\n  {% endif %}\n  b\n",
    "a {%- if true -%} b {%- endif %} c",
    "{% if true %}  \n x{% endif %}",
    "  {%+ if true %}kept{% endif %}",
    "{% if true +%}\nkept newline{% endif %}",
    "{{ 'x' }}\n{{ 'y' -}}\n  z\n",
    "{# a comment #}\nafter\n  {# indented #}\n  x {#- tight -#} y",
    "line\r\nwindows\rold mac\n\n",
    "\t{% for i in [1, 2] %}\n\t{{ i }}\n\t{% endfor %}\n",
    "{%- for m in messages -%}\n  [{{ m.role }}]\n{%- endfor %}",
    "  {% if true %}at the start{% endif %}\n  {{ 'output' }} {% if true %}mid-line{% endif %}",
    "{% if false %}a{% elif messages | length != 0 %}b{% elif true %}c{% else %}d{% endif %}",
    # literals and escapes
    "{{ 'é👋 \\u00e9' }} {{ \"中文\" ~ '\\U0001F600' }}",
    "{{ 'a\\x41\\u00e9\\d\\n\\t\\'\\\\' }}|{{ \"dq \\\"q\\\"\" }}|{{ 'ab' 'cd' }}",
    "{{ none }}{{ true }}{{ False }}{{ 12_000 }}{{ -3 }}",
    # operators
    "{{ 7 % 3 }} {{ -7 % 3 }} {{ 7 // -2 }} {{ 2 * 3 + 1 }} {{ 1 ~ 2 * 3 }} {{ 'a' ~ 1 ~ none }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'b' > 'a' }} {{ true == 1 }} {{ [1, 'a'] == [1, 'a'] }}",
    "{{ 'abc' < 'abd' }} {{ 'é' > 'z' }} {{ 2 >= 2 }} {{ 1 <= 0 }} {{ none is not none }}",
    "{{ 'ell' in 'hello' }} {{ 'x' not in 'hello' }} {{ 2 in [1, 2] }} {{ 'role' in messages[0] }}",
    "{{ not true or false and true }} {{ '' or 'default' }} {{ 'a' and 'b' }} {{ 0 or none }}",
    "{{ 'yes' if messages else 'no' }}|{{ 'shown' if false }}|{{ [1] + [2] == [1, 2] }}",
    # attribute, item, slices
    "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} {{ messages.0.role }}",
    "{{ messages[1:] | length }} {{ messages[:1][0].role }} {{ messages[::-1][0].role }}",
    "{{ 'héllo wörld'[1:4] }} {{ 'héllo'[-1] }} {{ 'abcdef'[::2] }} {{ 'abc'[5:] }}|",
    "{{ messages[9] is defined }} {{ messages[0].missing is defined }} {{ nothing is undefined }}",
    "[{{ nothing }}]{{ nothing | length }}{% for x in nothing %}never{% endfor %}",
    # loops
    "{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}"
    "{{ loop.length }}{{ loop.revindex }};{% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}",
    "{% for i in range(1, 10, 3) %}{{ loop.previtem is defined }}{{ loop.nextitem }}"
    "{{ loop.revindex0 }}|{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}"
    "{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 'two'}.items() %}{{ k }}={{ v }},{% endfor %}",
    "{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}",
    "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}"
    "{{ loop.index }}{% endfor %}",
    # scoping and namespace
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
    "{% if true %}{% set y = 'leaks' %}{% endif %}{{ y }}",
    "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}"
    "{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    "{% set messages = messages[1:] %}{{ messages | length }}",
    # filters
    "{{ '  a b  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hi' | upper }}{{ 'Hi' | lower }}",
    "{{ messages | length }} {{ 'héllo' | length }} {{ {'a': 1} | length }} {{ [1, 2] | count }}",
    "{{ messages[0] | tojson }}|{{ {'k': [1, true, none, 'é\"\\n']} | tojson(indent=2) }}",
    "{{ [] | tojson }} {{ {} | tojson(indent=4) }} {{ 'tab\\there' | tojson }}",
    "{{ ['a', 'b', 'c'] | join(', ') }} {{ [1, 2] | join }}",
    "{{ ['a', 'b'] | first }}{{ ['a', 'b'] | last }}{{ 'xyz' | first }}{{ [] | first is defined }}",
    "{{ nothing | default('dflt') }} {{ '' | default('dflt') }} {{ '' | default('dflt', true) }}",
    "{{ [1, 'code', 'x'] | reject('equalto', 'code') | list | length }}"
    "{{ ['a', 1] | select('string') | join }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
    "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}",
    "{% for k, v in {'a': 'x', 'b': 'y'} | items %}{{ k }}{{ v }}{% endfor %}{{ 5 | string }}",
    # tests
    "{{ 'a' is string }}{{ 1 is string }}{{ 1 is number }}{{ true is number }}{{ true is boolean }}"
    "{{ 1 is integer }}{{ none is none }}{{ {} is mapping }}{{ 'a' is iterable }}{{ 1 is iterable }}",
    "{{ 3 is odd }}{{ 3 is even }}{{ 'a' is eq('a') }}"
    "{{ 1 is ne(2) }}{{ nothing is not defined }}{{ true is true }}{{ 0 is false }}",
    # methods
    "{{ '  a  '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'a  '.rstrip() }}|{{ 'abc'.startswith('ab') }}"
    "{{ 'abc'.endswith(('x', 'c')) }}",
    "{{ ' a  b\\tc '.split() | join('/') }}|{{ 'a,b,,c'.split(',') | join('/') }}|"
    "{{ 'aXbX'.replace('X', '-') }}|{{ 'MiXed'.lower() }}{{ 'MiXed'.upper() }}",
    "{{ messages[0].get('role') }} {{ messages[0].get('nope') }} {{ messages[0].get('nope', 3) }}"
    " {{ messages[0].keys() | list | join(',') }} {{ messages[0].values() | list | length }}",
]


# Templates that both sides must refuse when rendering.
FAILING_PIECES = [
    "{{ raise_exception('custom refusal') }}",
    "{{ nothing.attr }}",
    "{{ 'a' + 1 }}",
    "{{ 1 + 2 ~ 3 }}",  # ~ binds tighter than +: 1 + '23'
    "{{ 1 // 0 }}",
    "{% for m in none %}{% endfor %}",
    "{% set x = 1 %}{{ x.y.z }}",
]


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
def test_jinja_pieces_render_as_transformers(tmp_path):
    messages = turns(("system", "sys"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"))
    cases = [{"template": piece, "messages": messages, "bos_token": "<s>", "eos_token": "</s>",
              "add_generation_prompt": False} for piece in PIECES + FAILING_PIECES]
    got = render_layup(tmp_path, TEMPLATES / "smollm.jinja", cases)
    for case, result in zip(cases, got):
        expected = render_transformers(case["template"], case)
        assert ("text" in expected) == (case["template"] in PIECES), (case["template"], expected)
        check_same(expected, result, repr(case["template"]))
    assert "custom refusal" in got[len(PIECES)]["error"]


def random_layout(rng, depth=0):
    """Random nesting of text, output, comment, set, if and for tags, each side of each tag with
    or without "-" / "+", around text of spaces, tabs, newlines and Unicode spaces: the cases of
    trim_blocks, lstrip_blocks and whitespace control that meet."""
    texts = ["", " ", "  ", "\n", "\n\n", "\t", " \n ", "x", "a b", "\n  ", "\u3000", "\u00a0\n"]

    def text():
        return "".join(rng.choice(texts) for _ in range(rng.randint(0, 3)))

    def sign(plus=True):
        return rng.choice(["", "", "-", "+"] if plus else ["", "", "-"])

    out = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.3:
            out.append(text())
        elif kind < 0.5:
            out.append("{{%s messages[0].content ~ x %s}}" % (sign(), sign(False)))
        elif kind < 0.6:
            out.append("{#%s c %s#}" % (sign(), sign()))
        elif kind < 0.7:
            out.append("{%%%s set x = 'v' %s%%}" % (sign(), sign()))
        elif kind < 0.85 and depth < 3:
            out.append("{%%%s if true %s%%}" % (sign(), sign()) + text() + random_layout(rng, depth + 1)
                       + "{%%%s else %s%%}x{%%%s endif %s%%}" % (sign(), sign(), sign(), sign()))
        elif depth < 3:
            out.append("{%%%s for m in messages %s%%}" % (sign(), sign()) + text()
                       + random_layout(rng, depth + 1) + "{%%%s endfor %s%%}" % (sign(), sign()))
    return "".join(out)


def test_random_whitespace_layouts_render_as_transformers(tmp_path):
    rng = random.Random(44)
    messages = turns(("user", " hi\n"), ("assistant", "yo"))
    cases = [{"template": random_layout(rng) + "\n", "messages": messages, "bos_token": "",
              "eos_token": "", "add_generation_prompt": False} for _ in range(400)]
    got = render_layup(tmp_path, TEMPLATES / "smollm.jinja", cases)
    rendered = 0
    for case, result in zip(cases, got):
        expected = render_transformers(case["template"], case)
        check_same(expected, result, repr(case["template"]))
        rendered += "text" in expected
    assert rendered > 300


def random_expression(rng, depth=0):
    """A random expression over values of every kind, with the operators, filters, tests, methods,
    subscripts and slices of the subset (not range() or tuples, which jinja2 keeps as Python types
    layup's lists stand for, nor the filters jinja2 evaluates lazily)."""
    atoms = ["0", "1", "-2", "7", "true", "false", "none", "''", "'a'", "' x y '", "'héllo'",
             "'a,b'", "'AbC'", "[1, 2, 3]", "['a', 'b']", "[]", "{'k': 'v', 'n': 1}", "messages",
             "messages[0]", "m", "nothing", "ns.n", "ns", "'\\u3000x\\t'"]
    operators = ["+", "-", "*", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in",
                 "and", "or"]
    filters = ["trim", "length", "upper", "lower", "tojson", "first", "last", "list", "string",
               "default('d')", "join(',')", "join", "count", "tojson(indent=2)",
               "default('d', true)"]
    tests = ["defined", "undefined", "none", "string", "number", "integer", "boolean", "mapping",
             "iterable", "true", "false", "odd", "even", "eq(1)", "ne('a')", "equalto('a')"]
    methods = ["strip()", "lstrip('x')", "rstrip()", "startswith('a')", "endswith(('o', 'b'))",
               "split()", "split(',')", "upper()", "lower()", "replace('a', 'z')", "get('role')",
               "get('x', 2)"]
    kind = rng.random()
    if depth > 3 or kind < 0.3:
        return rng.choice(atoms)
    sub = lambda: random_expression(rng, depth + 1)  # noqa: E731
    if kind < 0.5:
        return "(%s %s %s)" % (sub(), rng.choice(operators), sub())
    if kind < 0.6:
        return "(%s | %s)" % (sub(), rng.choice(filters))
    if kind < 0.68:
        return "(%s is %s%s)" % (sub(), rng.choice(["", "not "]), rng.choice(tests))
    if kind < 0.76:
        return "%s.%s" % (rng.choice(atoms), rng.choice(methods))
    if kind < 0.82:
        return "%s[%s]" % (rng.choice(atoms), rng.choice(["0", "-1", "'role'", "1:", ":-1",
                                                            "::-1", "5", "1:2"]))
    if kind < 0.88:
        return "(not %s)" % sub()
    if kind < 0.94:
        return "(%s if %s else %s)" % (sub(), sub(), sub())
    return "%s.%s" % (rng.choice(atoms), rng.choice(["role", "content", "n", "x"]))


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
def test_random_expressions_evaluate_as_transformers(tmp_path):
    """Where jinja2 prints a value, layup prints the same or refuses by name (a list's Python
    spelling, upper() of non-ASCII text...); where jinja2 fails, layup fails."""
    rng = random.Random(44)
    messages = turns(("user", " hi "), ("assistant", "yo"))
    cases = [{"template": "{% set ns = namespace(n=3) %}{% set m = messages[-1] %}{{ "
                          + random_expression(rng) + " }}",
              "messages": messages, "bos_token": "", "eos_token": "",
              "add_generation_prompt": False} for _ in range(600)]
    got = render_layup(tmp_path, TEMPLATES / "smollm.jinja", cases)
    same = 0
    for case, result in zip(cases, got):
        expected = render_transformers(case["template"], case)
        if "text" in expected and "error" in result:
            assert any(refusal in result["error"] for refusal in
                       ["not supported", "printing a", "non-ASCII", "used without calling"]), (
                case["template"], expected, result)
            continue
        check_same(expected, result, repr(case["template"]))
        same += "text" in expected
    assert same > 200


def test_llama3_2_takes_todays_date(tmp_path):
    """strftime_now is the local date, as transformers' (the test could only fail at midnight)."""
    case = {"messages": turns(("user", "hi")), "bos_token": "<s>", "eos_token": "</s>",
            "add_generation_prompt": True}
    got = render_layup(tmp_path, TEMPLATES / "llama3_2.jinja", [case])[0]
    import datetime
    assert "Today Date: " + datetime.datetime.now().strftime("%d %b %Y") in got["text"]
