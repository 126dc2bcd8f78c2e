"""A mirror link's TLS settings in the catalog (docs/mirror.md "TLS to the source"): the
command's and the snapshot's encodings (round trip; encodings from before the fields
still decode, and a plain link is still written byte for byte as before), the CA
bundle's bounds and refusals, and what a link shows of it (never the bundle)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from multiraft.errors import InvalidRequest, SnapshotFormatError
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import decode_command, encode_command
from multiraft.metadata.mirror_commands import CreateMirrorLink
from multiraft.metadata.pem_bundle import (
    CERTIFICATES_MAX,
    PEM_BUNDLE_BYTES_MAX,
    PemBundleError,
    describe_bundle,
    fingerprint_sha256,
    parse_certificates,
)
from tests.tls_pki import Pki, make_pki
from tests.unit.test_mirror_catalog import _catalog


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _pem(der: bytes) -> str:
    body = base64.b64encode(der).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"


def _link(**fields: object) -> CreateMirrorLink:
    return CreateMirrorLink(**{"name": "dr", "sources": ("h:1",), "pattern": "t", **fields})  # type: ignore[arg-type]




# Goal: a link's TLS fields survive the command's encoding; a plain link is written exactly
# as before the fields existed (an older node applies it), and a command an older node wrote
# (no such fields) decodes as a plain HTTP link.
def test_command_round_trip_and_older_commands_decode(pki: Pki) -> None:
    ca = pki.ca.cert.read_text()
    for command in (_link(), _link(source_tls=True), _link(source_tls=True, source_ca=ca, token="t0k",
                                                           verify_interval_s=60)):
        assert decode_command(encode_command(command)) == command
    older = (b'{"name":"dr","pattern":"t","priority":"normal","sources":["h:1"],"token":null,'
             b'"type":"create_mirror_link","v":1,"verify_interval_s":null}')
    assert encode_command(_link()) == older
    decoded = decode_command(older)
    assert isinstance(decoded, CreateMirrorLink) and decoded.source_tls is False and decoded.source_ca is None
    https = json.loads(encode_command(_link(source_tls=True)))
    assert https["source_tls"] is True and "source_ca" not in https  # a CA only when given
    with pytest.raises(InvalidRequest):  # an unknown field is still refused
        decode_command(older.replace(b'"v":1', b'"v":1,"source_tls_v2":true'))


# Goal: the catalog snapshot keeps an HTTPS link's settings (its CA too); a catalog of plain
# links snapshots exactly as before, and rows of six and seven elements (older snapshots) decode.
def test_snapshot_round_trip_and_older_rows_decode(pki: Pki) -> None:
    ca = pki.ca.cert.read_text()
    catalog = _catalog(_link(), _link(name="tls", source_tls=True, source_ca=ca, token="t0k"),
                       _link(name="system", source_tls=True, verify_interval_s=60))
    restored = Catalog.restore(catalog.snapshot())
    assert restored.mirror_links == catalog.mirror_links
    assert restored.mirror_links["tls"].source_ca == ca and restored.mirror_links["system"].source_ca is None
    rows = {row[0]: row for row in json.loads(catalog.snapshot())["mirror_links"]}
    assert len(rows["dr"]) == 6
    assert rows["tls"][6:] == [None, {"tls": True, "ca": ca}] and rows["system"][6:] == [60, {"tls": True}]

    document = json.loads(_catalog().snapshot())
    document["mirror_links"] = [["old6", ["h:1"], "t", "normal", "paused", None],
                                ["old7", ["h:2"], "t*", "low", "running", "tok", 3600]]
    older = Catalog.restore(json.dumps(document).encode())
    assert {n: (link.source_tls, link.source_ca, link.verify_interval_s) for n, link in older.mirror_links.items()} \
        == {"old6": (False, None, None), "old7": (False, None, 3600)}
    for bad_extra in ({"tls": False}, {"tls": True, "ca": "not pem"}, {"tls": True, "other": 1}, ["tls"]):
        document["mirror_links"] = [["bad", ["h:1"], "t", "normal", "running", None, None, bad_extra]]
        with pytest.raises(SnapshotFormatError):
            Catalog.restore(json.dumps(document).encode())


def test_a_link_shows_its_scheme_and_the_ca_summed_up_never_whole(pki: Pki) -> None:
    ca = pki.ca.cert.read_text()
    bundle = ca + "subject=rogue\n" + pki.rogue_ca.cert.read_text()  # text between blocks, as bundles carry
    shown = _catalog(_link(source_tls=True, source_ca=bundle)).mirror_links["dr"].describe()
    assert shown["scheme"] == "https" and shown["source_tls"] is True
    ders = parse_certificates(bundle)
    assert shown["source_ca"] == {"certificates": 2, "fingerprints_sha256": [fingerprint_sha256(d) for d in ders]}
    assert "BEGIN" not in json.dumps(shown) and ca.splitlines()[1] not in json.dumps(shown)
    assert "BEGIN" not in repr(_link(source_tls=True, source_ca=ca))
    plain = _link().link().describe()
    assert plain["scheme"] == "http" and plain["source_ca"] is None


def _refusals(pki: Pki) -> list[tuple[dict[str, object], str]]:
    ca = pki.ca.cert.read_text()
    key = pki.ca.key.read_text()
    one = parse_certificates(ca)[0]
    return [
        ({"source_tls": "yes"}, "source_tls is true or false"),
        ({"source_tls": 1}, "source_tls is true or false"),
        ({"source_ca": ca}, "set source_tls too"),
        ({"source_tls": True, "source_ca": 7}, "PEM text"),
        ({"source_tls": True, "source_ca": ""}, "holds no PEM certificate"),
        ({"source_tls": True, "source_ca": "hello"}, "holds no PEM certificate"),
        ({"source_tls": True, "source_ca": ca + key}, "private key"),
        ({"source_tls": True, "source_ca": key}, "private key"),
        # indented (pasted from YAML): OpenSSL skips it as text, but it would be stored and shown
        ({"source_tls": True, "source_ca": ca + "".join("  " + line for line in key.splitlines(True))},
         "private key"),
        ({"source_tls": True, "source_ca": ca.replace("-----END CERTIFICATE-----", "")}, "no END line"),
        ({"source_tls": True, "source_ca": ca.replace("END CERTIFICATE", "END X509 CRL")}, "do not pair up"),
        ({"source_tls": True, "source_ca": ca.replace("CERTIFICATE", "X509 CRL")}, "holds a X509 CRL block"),
        ({"source_tls": True, "source_ca": _pem(one)[:40] + "%%%\n" + _pem(one)[40:]}, "not base64"),
        ({"source_tls": True, "source_ca": _pem(one[:-1])}, "not a DER certificate"),
        ({"source_tls": True, "source_ca": _pem(b"\x04\x03abc")}, "not a DER certificate"),
        ({"source_tls": True, "source_ca": ca.replace("-----END", "é-----END")}, "not ASCII"),
        ({"source_tls": True, "source_ca": ca * (PEM_BUNDLE_BYTES_MAX // len(ca) + 1)}, "larger than 65536"),
        ({"source_tls": True, "source_ca": _pem(b"\x30\x00") * (CERTIFICATES_MAX + 1)}, "more than 64"),
    ]


# Goal: every malformed TLS setting is refused by the command itself (so by the HTTP route,
# the decoder of a committed entry and the snapshot alike), with a message naming what is wrong.
def test_tls_fields_are_bounded_and_checked(pki: Pki) -> None:
    for fields, message in _refusals(pki):
        with pytest.raises(InvalidRequest) as raised:
            _link(**fields)
        assert message in str(raised.value), (fields, raised.value)


def test_the_bundle_check_is_by_shape(pki: Pki, tmp_path: Path) -> None:
    ca = pki.ca.cert.read_text()
    assert len(parse_certificates(ca)) == 1
    assert describe_bundle(ca)["certificates"] == 1
    # Windows line ends and trailing blanks are PEM still; a long-form DER length too.
    assert parse_certificates(ca.replace("\n", "\r\n")) == parse_certificates(ca)
    assert parse_certificates(_pem(b"\x30\x81\x80" + b"\x00" * 128)) == (b"\x30\x81\x80" + b"\x00" * 128,)
    with pytest.raises(PemBundleError):
        parse_certificates(_pem(b"\x30\x85" + b"\x00" * 8))  # a length of five bytes: more than any bundle
