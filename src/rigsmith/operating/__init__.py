"""Operations on a deployed rig: doctor (preflight), up/down/status/logs, wait, bench, proxy entries."""
