#!/usr/bin/env bash
# The signal- and timing-sensitive tests, run while two busy loops keep both cores of this machine at 100 %,
# three rounds in a row (issue 26: a test that only passes on a quiet machine is a broken test).
#
#   scripts/loaded-tests.sh [ROUNDS] [-- extra pytest args]
#   WHOLE=1 scripts/loaded-tests.sh 1      # the whole suite (the README's test command) under the same load
#
# The hogs are plain `python3 -c 'while 1: pass'` processes (no stress-ng needed), one per core; they are
# killed by their ids when the script ends, however it ends. Exit status: non-zero when any round failed.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-3}
shift $(($# > 0 ? 1 : 0))
[[ ${1:-} == -- ]] && shift

TESTS=(
  # Ctrl-C during a download: queued files cancelled, the running transfer stopped, its partial kept.
  "tests/resolving/test_fetch_hostile.py::test_ctrl_c_cancels_queued_files_stops_transfers_and_keeps_partials"
  "tests/resolving/test_fetch_hostile.py::test_a_stop_ends_a_download_waiting_out_a_retry_backoff"
  # kill -9 in the middle of unbundle, then a resume.
  "tests/operating/bundle/test_bundle_real.py::test_kill_9_during_unbundle_then_the_next_run_resumes_and_ends_verified"
  # systemd's restart delay, read from systemd's own clock (a crash loop is not restarted in 100 ms).
  "tests/rendering/test_quadlet_systemd.py::test_an_engine_crashing_at_startup_is_restarted_after_restartsec_not_in_a_tight_loop"
  "tests/rendering/test_quadlet_systemd.py::test_notify_healthy_holds_systemctl_start_until_the_health_check_passes"
  # Progress bars on a real pty: they end clean (no partial line, no bar left) however slow the machine.
  "tests/operating/bundle/test_progress_pty.py::test_fetch_build_and_bundle_show_progress_and_end_clean_in_a_terminal"
  # The engine started with no route out; the health probe from inside; a Hub attempt named.
  "tests/operating/upgrade/test_offline_real.py::test_up_offline_answers_health_from_inside_a_namespace_with_no_route_out"
  "tests/operating/upgrade/test_offline_real.py::test_prove_offline_names_the_hub_the_engine_tried_to_reach"
  # Two nodes over real sshd, each node's run.sh in its own podman, Ray formed by the artifacts.
  "tests/operating/test_cluster_ssh.py::test_up_runs_each_node_s_generated_script_over_ssh_and_the_artifacts_form_the_cluster"
  # Probes of this machine, read twice (doctor against what the commands print here).
  "tests/operating/test_doctor.py::test_doctor_on_this_machine_tells_the_truth"
  # A hostile deployment file through the CLI (deep YAML; one paragraph, no traceback).
  "tests/resolving/test_fetch_hostile.py::test_a_broken_deployment_file_is_one_paragraph_through_the_cli"
)

[[ -n ${WHOLE:-} ]] && TESTS=()

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${hogs[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_hogs EXIT

for _ in $(seq "$(nproc)"); do
  python3 -c 'while 1: pass' &
  hogs+=("$!")
done
echo "hogs: ${hogs[*]} (one per core)"

failed=0
for round in $(seq "$rounds"); do
  echo "== round $round of $rounds, under load: $(cut -d' ' -f1-3 /proc/loadavg)"
  if python3 -m pytest -q -p no:cacheprovider ${TESTS[@]+"${TESTS[@]}"} "$@"; then
    echo "== round $round: green"
  else
    echo "== round $round: RED"
    failed=1
  fi
done
exit "$failed"
