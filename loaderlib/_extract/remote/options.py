"""``storage_options`` (boto3's names) and the standard AWS environment variables, resolved
once into a frozen :class:`StoreOptions`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = ["StoreOptions"]

# boto3 / botocore spellings -> obstore's S3 config keys.
_S3_KEYS = {
    "endpoint_url": "endpoint",
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
    "region_name": "region",
}
# Environment variables, in order of precedence per setting (boto3's names; storage_options win).
_ENV = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "aws_access_key_id": ("AWS_ACCESS_KEY_ID",),
    "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "aws_session_token": ("AWS_SESSION_TOKEN",),
    "region_name": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
# Options of the transfer itself (not of one protocol), in seconds or counts.
_CLIENT = ("timeout", "connect_timeout", "max_retries", "retry_timeout", "backoff", "max_backoff",
           "allow_http", "anon", "ranges_while_caching")


@dataclass(frozen=True)
class StoreOptions:
    """How to reach a store: credentials, endpoint and the transfer's bounds.

    Parameters
    ----------
    endpoint_url, aws_access_key_id, aws_secret_access_key, aws_session_token, region_name
        boto3's names; each falls back to its environment variable (``AWS_ENDPOINT_URL``,
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
        ``AWS_REGION`` / ``AWS_DEFAULT_REGION``).
    timeout : float
        Seconds one request may take, connecting included; a server that stops answering
        is abandoned after it (then retried like any timeout). Default 30.
    connect_timeout : float
        Seconds to establish a connection. Default 5.
    max_retries : int
        Retries of a request that failed with 5xx, 429, a dropped connection, a timeout or
        a short body. Default 10 (obstore's).
    retry_timeout : float
        Seconds after the first try past which no retry starts. Default 180.
    backoff, max_backoff : float
        First and largest wait between retries (exponential with jitter). Default 0.1, 15.
    allow_http : bool
        Plain-http endpoints; on by default when the endpoint or URL is ``http://``.
    anon : bool
        Unsigned requests (public buckets).
    ranges_while_caching : bool
        With ``cache_dir``: a sample of a shard whose whole-shard download is listed or
        under way is read by byte range from the store instead of waiting for the copy
        (NOTE [ Samples of a shard still on its way ] in ``files.py``). Off by default: worth
        it where a ranged request is cheap for the store; against moto's S3 server it made
        cold epochs slower.
    extra : dict
        Any other key, passed to the store as it is (obstore's names, e.g.
        ``virtual_hosted_style_request`` or ``service_account_path``).
    """

    endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    region_name: str | None = None
    timeout: float = 30.0
    connect_timeout: float = 5.0
    max_retries: int = 10
    retry_timeout: float = 180.0
    backoff: float = 0.1
    max_backoff: float = 15.0
    allow_http: bool | None = None
    anon: bool = False
    ranges_while_caching: bool = False
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def resolve(cls, storage_options: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> StoreOptions:
        """Options from ``storage_options`` over the environment."""
        given = dict(storage_options or {})
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}
        for name, names in _ENV.items():
            value = given.pop(name, None)
            if value is None:
                value = next((env[n] for n in names if env.get(n)), None)
            kw[name] = value
        for name in _CLIENT:
            if name in given:
                kw[name] = given.pop(name)
        for k in ("timeout", "connect_timeout", "retry_timeout", "backoff", "max_backoff"):
            if k in kw and (not isinstance(kw[k], (int, float)) or kw[k] <= 0):
                raise ValueError(f"storage_options[{k!r}] must be a positive number of seconds, got {kw[k]!r}")
        if not isinstance(kw.get("ranges_while_caching", False), bool):
            raise ValueError(f"storage_options['ranges_while_caching'] must be True or False, "
                             f"got {kw['ranges_while_caching']!r}")
        if "max_retries" in kw and (not isinstance(kw["max_retries"], int) or kw["max_retries"] < 0):
            raise ValueError(f"storage_options['max_retries'] must be an int >= 0, got {kw['max_retries']!r}")
        return cls(**kw, extra=tuple(sorted(given.items())))

    def client_options(self, url_is_http: bool) -> dict:
        allow = self.allow_http
        if allow is None:
            endpoints = (self.endpoint_url, dict(self.extra).get("base_url"))   # S3's; GCS's (an emulator's)
            allow = url_is_http or any(isinstance(u, str) and u.startswith("http://") for u in endpoints)
        return {"allow_http": bool(allow), "timeout": timedelta(seconds=self.timeout),
                "connect_timeout": timedelta(seconds=self.connect_timeout)}

    def retry_config(self) -> dict:
        return {"max_retries": int(self.max_retries), "retry_timeout": timedelta(seconds=self.retry_timeout),
                "backoff": {"init_backoff": timedelta(seconds=self.backoff),
                            "max_backoff": timedelta(seconds=self.max_backoff), "base": 2}}

    def s3_config(self) -> dict:
        out = {_S3_KEYS[k]: getattr(self, k) for k in _S3_KEYS if getattr(self, k) is not None}
        if self.anon:
            out["skip_signature"] = True
        out.update(self.extra)
        return out

    def gcs_config(self) -> dict:
        """GCSStore's config: the extra keys as they are (obstore's names: ``base_url``,
        ``service_account_path``, ``bearer_token``, ...), ``anon`` as ``skip_signature``.
        boto3's names are S3's and are not used; obstore also reads ``GOOGLE_*`` variables."""
        out = dict(self.extra)
        if self.anon:
            out["skip_signature"] = True
        return out
