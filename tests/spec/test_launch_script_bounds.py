"""The launch-script reader on scripts no one would write but anyone can give: conditions with nothing to test,
an if without its fi, nesting hundreds deep, variables that grow from themselves, layouts that repeat a layer
billions of times, files that are devices, pipes, binary or too large, and lines megabytes long. Each ends in
an answer or one sentence (exit 2 from the command line), never a traceback, a hang or all of memory."""

from __future__ import annotations

import os
import tracemalloc

import pytest
from click.testing import CliRunner

from simulator.cli import cli
from simulator.spec import limits
from simulator.spec.errors import ConfigError
from simulator.spec.megatron_args import parse_launch
from simulator.spec.megatron_values import layout_split
from simulator.spec.shell_script import launch_words, read_launch
from simulator.spec.shell_words import tokenize

FLAGS = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 128 --bf16\n"


def refused(*args: str, input: bytes | str | None = None) -> str:
    result = CliRunner().invoke(cli, ["plan", *args], input=input)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    return result.output


# --- conditions and nesting ------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["if ! ; then X=1; fi\n", "if ! ! ; then Y=1; fi\n"])
def test_a_condition_that_negates_nothing_is_refused(text):
    with pytest.raises(ConfigError, match=r"negates nothing"):
        launch_words(text + FLAGS)


def test_an_empty_condition_skips_its_block():
    words, notes = launch_words("if ; then Z=1; fi\n" + FLAGS)
    assert words[:2] == ["--num-layers", "2"] and any("if-block" in n for n in notes)


@pytest.mark.parametrize("text", ["if [ 1 = 1 ]; then\n--num-layers 2\n", "if [ 1 = 2 ]; then\n--num-layers 2\n",
                                  "X=1\nif [ 1 = 1 ]; then X=2\nelse\n"])
def test_an_if_without_its_fi_is_refused_naming_its_line(text):
    with pytest.raises(ConfigError, match=r"the if on line \d+ .* has no fi"):
        launch_words(text)


def _nested_ifs(depth: int) -> str:
    return "if [ 1 = 1 ]; then\n" * depth + FLAGS + "fi\n" * depth


def _nested_defaults(depth: int) -> str:
    return "X=" + "${A:-" * depth + "2" + "}" * depth + "\n--num-layers $X\n"


def test_nesting_is_read_to_its_bound_and_refused_past_it():
    bound = limits.MAX_SCRIPT_NESTING
    assert launch_words(_nested_ifs(bound))[0][:2] == ["--num-layers", "2"]
    assert launch_words(_nested_defaults(bound))[0] == ["--num-layers", "2"]
    for text, what in ((_nested_ifs(bound + 1), "if-blocks"), (_nested_defaults(bound + 1), "defaults")):
        with pytest.raises(ConfigError, match=f"nests .*{what} more than {bound} deep"):
            launch_words(text)


def test_scripts_nested_hundreds_deep_are_one_sentence():
    refused("--megatron-args", "-", input=_nested_ifs(330))
    refused("--megatron-args", "-", input=_nested_defaults(200))


# --- what expansion may build ----------------------------------------------------------------------

def test_a_variable_that_doubles_itself_is_refused_before_it_fills_memory():
    script = "A=x\n" + "A=$A$A\n" * 40 + "torchrun pretrain_gpt.py --num-layers 2 --x \"$A\"\n"
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=f"expand to more than {limits.MAX_SCRIPT_EXPANSION_BYTES:,}"):
            read_launch(script)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * limits.MAX_SCRIPT_EXPANSION_BYTES  # 2^41 characters asked for
    refused("--megatron-args", "-", input=script)


def test_an_array_joined_and_appended_to_itself_is_bounded_too():
    script = "A=(" + "x" * 1000 + ")\n" + 'A+=("${A[*]}" "${A[*]}")\n' * 40 + FLAGS
    with pytest.raises(ConfigError, match="expand to more than"):
        read_launch(script)


@pytest.mark.parametrize("layout", ["t*99999999999", "(t*0)*99999999999", "E|(t*2|)*9999999999t|L",
                                    "t*" + "9" * 5000])
def test_a_layout_is_measured_before_it_is_spelled_out(layout):
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="repeats .* times, more than a model of at most"):
            layout_split(layout, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert layout_split("E(t*3|)*3t*3L", 4) == (3, 3, 3, 3)  # the form that is read is still read
    refused("--megatron-args", "-", input=f"--num-layers 2 --pipeline-model-parallel-layout '{layout}'")


# --- files and standard input ----------------------------------------------------------------------

def test_devices_pipes_folders_and_large_files_are_refused_unread(tmp_path):
    fifo = tmp_path / "launch.fifo"
    os.mkfifo(fifo)  # no writer: reading it would wait for ever
    large = tmp_path / "large.sh"
    with open(large, "wb") as f:
        f.truncate(limits.MAX_INPUT_FILE_BYTES + 1)
    assert "not a regular file" in refused("--megatron-args", "/dev/zero")
    assert "not a regular file" in refused("--megatron-args", str(fifo))
    assert "is a folder" in refused("--megatron-args", str(tmp_path))
    assert f"more than the {limits.MAX_INPUT_FILE_BYTES:,}" in refused("--megatron-args", str(large))


def test_standard_input_is_read_to_a_bound_and_must_be_text():
    assert "more than the" in refused("--megatron-args", "-", input=b"--num-layers 2 " * (limits.MAX_INPUT_FILE_BYTES
                                                                                          // 15 + 1))
    assert "not UTF-8 text" in refused("--megatron-args", "-", input=bytes(range(128, 256)))
    assert "NUL" in refused("--megatron-args", "-", input=b"--num-layers 2\0")


def test_binary_and_nul_files_are_one_sentence(tmp_path):
    binary, nul = tmp_path / "binary.sh", tmp_path / "nul.sh"
    binary.write_bytes(bytes(range(256)) * 4)
    nul.write_bytes(b"\0" * 1000)
    assert "not UTF-8 text" in refused("--megatron-args", str(binary))
    assert "NUL" in refused("--megatron-args", str(nul))


# --- long lines ------------------------------------------------------------------------------------

def test_a_line_of_megabytes_is_tokenized_in_one_pass():
    words = 700_000  # 2.1 MB of `$A ` on one line
    tokens = tokenize("$A " * words)
    assert len(tokens) == words and tokens[0][0].text == "$A" and tokens[-1][0].line == 1
    assert len({id(t) for t in tokens}) == 1  # one word, repeated, is held once
    launch = read_launch("A=--x\ntorchrun pretrain_gpt.py " + "$A " * 100_000)
    assert launch.words[2:] == ["--x"] * 100_000


def test_plain_words_and_the_character_reader_agree():
    """A run of plain words is taken in one step; words with quotes, escapes or other expansions are read
    character by character: both give what bash gives."""
    text = ('A=1 B="two words"\ntorchrun x.py --a=$A ${B} "$B" --c $A$A x${A}y \\$A 2>&1 a\\ b ${C:-3} '
            "'$A' $((A+1)) #c\n")
    words, _ = launch_words(text)
    assert words == ["torchrun", "x.py", "--a=1", "two", "words", "two words", "--c", "11", "x1y", "$A", "a b", "3",
                     "$A", "2"]
