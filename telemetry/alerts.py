"""Admin alerts: always the log; email over SMTP and an HTTP webhook when configured."""

from __future__ import annotations

import json
import logging
import smtplib
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from vcrawl.settings import Settings

__all__ = ["Alert", "Alerter"]

logger = logging.getLogger(__name__)
_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Alert:
    """What an operator is told: a subject, a text and machine-readable details."""

    subject: str
    text: str
    details: Mapping[str, Any] = field(default_factory=dict)


class Alerter:
    """Sends an alert to every configured channel; a broken channel is logged, never raised."""

    def __init__(
        self,
        webhook_url: str | None = None,
        smtp_host: str | None = None,
        smtp_port: int = 25,
        email_from: str = "vcrawl@localhost",
        email_to: tuple[str, ...] = (),
        smtp_login: tuple[str, str] | None = None,
        smtp_starttls: bool = False,
    ) -> None:
        self._webhook_url = webhook_url
        self._smtp_host, self._smtp_port = smtp_host, smtp_port
        self._email_from, self._email_to = email_from, email_to
        self._smtp_login, self._smtp_starttls = smtp_login, smtp_starttls

    @classmethod
    def from_settings(cls, settings: Settings) -> Alerter:
        """Build from settings (the SMTP password comes from ``VCRAWL_SMTP_PASSWORD``)."""
        login = None
        if settings.smtp_user is not None:
            login = (settings.smtp_user, settings.smtp_password or "")
        return cls(
            webhook_url=settings.alert_webhook_url,
            smtp_host=settings.smtp_host,
            smtp_port=settings.smtp_port,
            email_from=settings.alert_email_from,
            email_to=settings.alert_email_to,
            smtp_login=login,
            smtp_starttls=settings.smtp_starttls,
        )

    def send(self, alert: Alert) -> list[str]:
        """Deliver ``alert``; return the channels that took it (``log`` is always one)."""
        logger.error("ALERT %s: %s %s", alert.subject, alert.text, json.dumps(dict(alert.details), default=str))
        delivered = ["log"]
        if self._smtp_host is not None and self._email_to:
            try:
                self._send_email(alert)
                delivered.append("email")
            except (OSError, smtplib.SMTPException) as exc:
                logger.warning("alert email to %s failed: %s", self._smtp_host, exc)
        if self._webhook_url is not None:
            try:
                self._post_webhook(alert)
                delivered.append("webhook")
            except OSError as exc:  # URLError and HTTPError are OSErrors
                logger.warning("alert webhook %s failed: %s", self._webhook_url, exc)
        return delivered

    def _send_email(self, alert: Alert) -> None:
        message = EmailMessage()
        message["Subject"] = f"[vcrawl] {alert.subject}"
        message["From"] = self._email_from
        message["To"] = ", ".join(self._email_to)
        details = "\n".join(f"{name}: {value}" for name, value in alert.details.items())
        message.set_content(f"{alert.text}\n\n{details}\n")
        assert self._smtp_host is not None
        with smtplib.SMTP(self._smtp_host, self._smtp_port, timeout=_TIMEOUT_S) as smtp:
            if self._smtp_starttls:
                smtp.starttls()
            if self._smtp_login is not None:
                smtp.login(*self._smtp_login)
            smtp.send_message(message)

    def _post_webhook(self, alert: Alert) -> None:
        assert self._webhook_url is not None
        body = json.dumps(
            {"subject": alert.subject, "text": alert.text, "details": dict(alert.details)}, default=str
        ).encode()
        request = urllib.request.Request(
            self._webhook_url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            response.read(1024)
