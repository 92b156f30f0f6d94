from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from envpipe.atomicfile import new_file_mode
from envpipe.profile import ProfileError, embedded_profile_path, load_profile

HEADER = "stage,instruction,frequency,time,energy\n"


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "p.csv"
    path.write_text(header + body)
    return path


def good_rows(stages: int = 2, clocks: tuple[int, ...] = (1410, 1200)) -> str:
    rows = []
    for s in range(stages):
        for f in clocks:
            rows.append(f"{s},forward,{f},{0.01 * 1410 / f:.6f},{2.0 + s}")
            rows.append(f"{s},backward,{f},{0.02 * 1410 / f:.6f},{4.0 + s}")
    return "\n".join(rows) + "\n"


def test_loads_both_real_profiles(gpt3, bloom):
    assert gpt3.num_stages == 8 and bloom.num_stages == 8
    assert gpt3.f_max == 1410 and int(gpt3.freqs[-1]) == 855 and gpt3.freqs.size == 38
    assert bloom.f_max == 1740 and bloom.freqs.size == 60
    assert np.all(np.diff(gpt3.freqs) < 0)
    assert gpt3.fwd_time[0, 0] == pytest.approx(0.05016166687011708)
    assert gpt3.bwd_energy[0, 1] == pytest.approx(44.4433200000003)


def test_small_valid_profile_round_trips(tmp_path):
    p = load_profile(write(tmp_path, good_rows()))
    assert p.num_stages == 2 and list(p.freqs) == [1410, 1200]
    out = tmp_path / "again.csv"
    p.to_csv(out)
    q = load_profile(out)
    assert np.array_equal(p.fwd_time, q.fwd_time) and np.array_equal(p.bwd_energy, q.bwd_energy)


@pytest.mark.parametrize(
    ("body", "header", "line", "reason"),
    [
        ("0,forward,1410,0.1,1\n", "stage,instruction,frequency,time\n", 1, "missing column(s): energy"),
        ("0,forward,1410,abc,1\n", HEADER, 2, "column 'time' is not a number"),
        ("0,forward,1410,0,1\n", HEADER, 2, "time must be in (0, 3600], got 0"),
        ("0,forward,1410,-0.5,1\n", HEADER, 2, "time must be in (0, 3600], got -0.5"),
        ("0,forward,1410,0.1,-1\n", HEADER, 2, "energy must be in (0, 1e+07], got -1"),
        ("0,sideways,1410,0.1,1\n", HEADER, 2, "instruction must be forward or backward"),
        ("0,forward,1410.5,0.1,1\n", HEADER, 2, "column 'frequency' is not an integer: '1410.5'"),
        ("0,forward,1410,nan,1\n", HEADER, 2, "time must be a finite number, got nan"),
        ("0,forward,1410,0.1,1\n0,forward,1410,0.2,1\n", HEADER, 3, "duplicate row for stage 0 forward at 1410 MHz"),
    ],
)
def test_row_errors_name_file_line_and_reason(tmp_path, body, header, line, reason):
    path = write(tmp_path, body, header)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert err.value.line == line
    assert reason in str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_stage_missing_backward_at_a_clock(tmp_path):
    body = good_rows().replace("1,backward,1200", "1,forward,1300")
    with pytest.raises(ProfileError, match="does not share stage 0's clock set"):
        load_profile(write(tmp_path, body))
    body = "\n".join(r for r in good_rows().splitlines() if not r.startswith("1,backward,1200")) + "\n"
    with pytest.raises(ProfileError, match=r"stage 1 has no backward row at \[1200\] MHz"):
        load_profile(write(tmp_path, body))


def test_stages_not_sharing_clocks_and_gaps(tmp_path):
    body = good_rows(1, (1410, 1200)) + good_rows(2, (1410, 1100)).split("\n", 4)[-1]
    with pytest.raises(ProfileError, match="does not share stage 0's clock set"):
        load_profile(write(tmp_path, body))
    body = "\n".join(r for r in good_rows(3).splitlines() if not r.startswith("1,")) + "\n"
    with pytest.raises(ProfileError, match=r"missing stage\(s\) \[1\]"):
        load_profile(write(tmp_path, body))


def test_empty_missing_and_binary_files(tmp_path):
    with pytest.raises(ProfileError, match="no data rows"):
        load_profile(write(tmp_path, ""))
    with pytest.raises(ProfileError, match="cannot open"):
        load_profile(tmp_path / "nope.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="not a UTF-8 profile file"):
        load_profile(binary)


def test_restrict_and_tile(gpt3):
    cut = gpt3.restricted([1410, 1200, 900])
    assert list(cut.freqs) == [1410, 1200, 900]
    assert cut.fwd_time[3, 1] == gpt3.fwd_time[3, gpt3.freq_index(1200)]
    tiled = gpt3.with_stages(20)
    assert tiled.num_stages == 20 and np.array_equal(tiled.bwd_time[9], gpt3.bwd_time[1])
    with pytest.raises(KeyError):
        gpt3.freq_index(1234)
    with pytest.raises(FileNotFoundError, match="shipped"):
        embedded_profile_path("nope")


def real_rows() -> tuple[str, str]:
    """The header and the body of the shipped GPT-3 profile (CRLF as shipped)."""
    text = embedded_profile_path().read_text()
    header, body = text.split("\n", 1)
    return header + "\n", body


def test_utf8_bom_is_accepted_and_digest_ignores_the_file_form(tmp_path):
    """A BOM (spreadsheet exports) was refused as "missing column(s): stage"; the digest is of the numbers."""
    header, body = real_rows()
    plain = load_profile(embedded_profile_path())
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (header + body).encode())
    lf = tmp_path / "lf.csv"
    lf.write_text((header + "".join(reversed(body.splitlines(keepends=True)))).replace("\r\n", "\n"))
    for other in (load_profile(bom), load_profile(lf)):
        assert np.array_equal(other.fwd_energy, plain.fwd_energy) and other.digest == plain.digest
    assert plain.digest.startswith("sha256:") and len(plain.digest) == 7 + 64
    changed = write(tmp_path, good_rows())
    assert load_profile(changed).digest != plain.digest


def test_duplicated_column_is_refused(tmp_path):
    """A duplicated `time` column was read silently (a baseline of 8,830.6 J where 2,863.0 J is right)."""
    header, body = real_rows()
    rows = [f"{r},{3 * float(r.split(',')[3])}" for r in body.replace("\r", "").splitlines()]
    path = write(tmp_path, "\n".join(rows) + "\n", header.strip() + ",time\n")
    with pytest.raises(ProfileError, match=r"p.csv:1: duplicate column\(s\): 'time'"):
        load_profile(path)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("0,forward,1410,0.1,0", "energy must be in (0, 1e+07], got 0"),  # one stage, zero energy: 0/0 before
        ("0,forward,1410,0.1,1e307", "energy must be in (0, 1e+07], got 1e+307"),  # inf/nan energies before
        ("0,forward,1410,1e308,1", "time must be in (0, 3600], got 1e+308"),
        ("1000000000,forward,1410,0.1,1", "stage must be in [0, 1023], got 1e+09"),  # 24 GB before
        ("0,forward,1000000000000000,0.1,1", "frequency must be in [1, 10000], got 1e+15"),
        ("0,forward,inf,0.1,1", "frequency must be a finite number, got inf"),
        ("0,forward,1410,0.1,1,extra", "6 fields, the header has 5"),
        ("0,forward", "2 fields, the header has 5"),
    ],
)
def test_numbers_and_sizes_out_of_range_are_refused(tmp_path, row, reason):
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, row + "\n"))
    assert err.value.line == 2 and err.value.reason == reason


def test_huge_inputs_are_refused_with_short_messages(tmp_path):
    if Path("/dev/zero").exists():  # refused before a byte is read
        with pytest.raises(ProfileError, match="not a regular file"):
            load_profile("/dev/zero")
    huge = tmp_path / "huge.csv"  # a sparse 1 GiB file: read up to the limit only
    with huge.open("wb") as fh:
        fh.truncate(2**30)
    with pytest.raises(ProfileError, match="larger than 16 MiB"):
        load_profile(huge)
    fifo = tmp_path / "fifo.csv"  # opening it to read would wait for a writer: never
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        load_profile(fifo)
    nul = tmp_path / "nul.csv"
    nul.write_bytes(HEADER.encode() + b"0,forward,1410,0.1,\x001\n")
    with pytest.raises(ProfileError, match="NUL bytes"):
        load_profile(nul)
    with pytest.raises(ProfileError) as err:  # one 100 kB cell: the message quotes 40 characters of it
        load_profile(write(tmp_path, "0,forward,1410," + "7" * 100 + "x" * 100_000 + ",1\n"))
    assert len(str(err.value)) < 200 and "not a number" in str(err.value)
    with pytest.raises(ProfileError, match="malformed CSV"):  # a field beyond the csv module's limit
        load_profile(write(tmp_path, '0,forward,1410,"' + "7" * 200_000 + '",1\n'))
    clocks = "".join(f"0,forward,{f},0.1,1\n0,backward,{f},0.1,1\n" for f in range(1, 1026))
    with pytest.raises(ProfileError, match="more than 1024 distinct clocks"):
        load_profile(write(tmp_path, clocks))
    with pytest.raises(ProfileError, match="empty file"):
        load_profile(write(tmp_path, "", header=""))


def test_to_csv_is_atomic_and_readable_by_others(tmp_path):
    p = load_profile(write(tmp_path, good_rows()))
    out = tmp_path / "new" / "again.csv"
    p.to_csv(out)
    assert out.stat().st_mode & 0o777 == new_file_mode()  # 0644 under umask 022
    assert [f.name for f in out.parent.iterdir()] == ["again.csv"]
