"""The runtime's chat-template rendering agrees with transformers' apply_chat_template."""

import pytest

import tiny_models as tm
from specedge.errors import BundleError
from specedge.runtime.chat import render_chat

TEMPLATE = ("{%- if messages[0]['role'] != 'system' %}{{ bos_token }}<|im_start|>system\nBe brief.<|im_end|>\n"
            "{%- endif %}\n{%- for m in messages %}\n<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
            "<|im_end|>\n{%- endfor %}\n{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}")


@pytest.mark.parametrize("template", [tm.CHAT_TEMPLATE, TEMPLATE])
def test_render_matches_transformers(template):
    tok = tm.byte_tokenizer(chat=True)
    tok.chat_template = template
    messages = [{"role": "user", "content": "  hello ✓ "}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(template, messages, tok.bos_token, tok.eos_token) == expected


def test_template_errors_are_bundle_errors():
    with pytest.raises(BundleError, match="chat template failed: no system"):
        render_chat("{{ raise_exception('no system') }}", [], None, None)
    for broken in ["{{ 1 + 'a' }}", "{{ undefined_thing | tojson }}"]:       # Python's errors inside a template too
        with pytest.raises(BundleError, match="chat template failed"):
            render_chat(broken, [], None, None)


def _lines(*lines):
    it = iter(lines)

    def read():
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def test_chat_messages_span_lines_between_triple_quotes_or_after_a_backslash():
    from specedge.chat_repl import read_message

    read = _lines('"""', "def f():", "", "    return 1", '"""', "first \\", "second", "alone", '"""', "unclosed")
    assert read_message(read) == "def f():\n\n    return 1"           # pasted code, blank line and all
    assert read_message(read) == "first \nsecond"
    assert read_message(read) == "alone"
    assert read_message(read) == "unclosed"                          # EOF ends an open block
    with pytest.raises(EOFError):
        read_message(read)


THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}")


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_template_kwargs_render_as_transformers_passes_them(kwargs):
    """Qwen3's switch: apply_chat_template(..., enable_thinking=False) adds an empty think block."""
    tok = tm.byte_tokenizer(chat=True)
    tok.chat_template = THINKING
    messages = [{"role": "user", "content": "hi"}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    assert render_chat(THINKING, messages, None, None, kwargs) == expected
    assert ("<think>" in expected) == (kwargs == {"enable_thinking": False})


def test_chat_template_kwargs_reach_the_prompt_and_bad_ones_are_option_errors(good_bundle):
    from specedge.errors import OptionError
    from specedge.runtime import load

    gen = load(good_bundle)
    gen.chat_template = THINKING
    messages = [{"role": "user", "content": "hi"}]
    plain, off = gen.encode_messages(messages), gen.encode_messages(messages, {"enable_thinking": False})
    assert gen.decode(off) == gen.decode(plain) + "<think>\n\n</think>\n\n"
    result = gen.chat(messages, chat_template_kwargs={"enable_thinking": False}, max_new_tokens=3, ignore_eos=True)
    assert result.stats.prompt_tokens == len(off)
    for bad, match in [([1], "must be a dict"), ({"1x": 1}, "variable name"),
                       ({"messages": []}, "may not set 'messages'")]:
        with pytest.raises(OptionError, match=match):
            gen.encode_messages(messages, bad)
