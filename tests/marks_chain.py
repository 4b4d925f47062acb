"""A throwaway C2PA signing chain for the tests: a CA and an ES256 signer certificate with the extensions
C2PA's certificate profile asks of a signer (digitalSignature, an extended key usage, not a CA, key ids)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SIGNER = "voxpipe test signer"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "voxpipe tests")])


def _usage(sign: bool, certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=sign, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=certs, crl_sign=certs,
                         encipher_only=False, decipher_only=False)


def signing_chain() -> tuple[bytes, bytes]:
    """(the signer's private key, the chain signer + CA), both PEM."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def certificate(subject: str, public, ca: bool) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name("voxpipe test CA"))
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
                .add_extension(_usage(not ca, ca), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False))

    ca = certificate("voxpipe test CA", ca_key.public_key(), True).sign(ca_key, hashes.SHA256())
    leaf = (certificate(SIGNER, key.public_key(), False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, leaf.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
