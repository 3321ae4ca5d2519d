# Sourced (BASH_ENV) by every bash in rigsmith's import jail before the recipe's text: see bashjail.py.
# Records go to fd $__RS_RFD as NUL-separated fields; bash's own trace goes to fd $__RS_XFD.
# shellcheck disable=SC2016,SC2153,SC2164  # literal patterns; the __RS_ fds come from bwrap
ulimit -u 32 -v 131072 -f 4096 -t 4 -c 0 2>/dev/null
__rs_rec() {
  local kind=$1 line=$2
  shift 2
  printf '%s\0' "$kind" "$line" "$#" "$@" >&"$__RS_RFD"
} 2>/dev/null
# A variable the text never sets, from the line where bash first found it unbound: the placeholder <NAME>.
# A blank (entry b:NAME, a name the text assigns only the empty string): the placeholder once it is empty.
__rs_placeholders() {
  local entry name at
  for entry in ${__RS_PH-}; do
    name=${entry#*:}
    at=${entry%%:*}
    # line 0: from the text's first command on (a name the text reads only through an empty default)
    if { [[ $at == b && -v $name && -z ${!name} ]]; } ||
      { [[ $at == "$1" || $at == 0 ]] && ! [[ -v $name ]]; }; then
      # spelled otherwise in the run that looks for decisions on values made from a placeholder
      if [[ " ${__RS_ALT-} " == *" $name "* ]]; then
        printf -v "$name" '<%s%s%s>' "$__RS_VARIED" "$name" "$__RS_VARIED"
      else
        printf -v "$name" '<%s>' "$name"
      fi
    fi
  done
}
# $1: the line; the rest: the positional parameters where the command runs (the text's, or its function's),
# so that a case word like "$1" expands to the text's own
__rs_dbg() {
  local -
  set +ux
  [[ ${BASH_SOURCE[1]-} == /rs/* ]] && return 1
  local line=$1
  shift
  __RS_LINE=$line
  if [[ ${__RS_PID-} != "$BASHPID" ]]; then # a new process (a subshell, a background job): counted
    __RS_PID=$BASHPID
    __rs_rec P "$line"
  fi
  __rs_placeholders "$line"
  if [[ -n ${__RS_FORVAR-} ]]; then
    # the first command of a loop's body: the loop variable holds a word of the loop's list
    [[ -v $__RS_FORVAR ]] && __rs_rec D "$line" "${!__RS_FORVAR}" "for $__RS_FORVAR in …"
    __RS_FORVAR=
  fi
  if [[ $BASH_COMMAND =~ ^for\ ([A-Za-z_][A-Za-z0-9_]*)\ in ]]; then
    __RS_FORVAR=${BASH_REMATCH[1]}
  fi
  if [[ $BASH_COMMAND == case\ * ]]; then
    # bash traces a case word unexpanded: expand a plain one here to see whether the case decides on an
    # unknown value (one holding a placeholder or the output of a command rigsmith did not run)
    local word=${BASH_COMMAND#case } value
    word=${word% in*}
    if [[ $word != *'$('* && $word != *'`'* && $word != *'(('* ]]; then
      eval "value=$word" 2>/dev/null && __rs_rec D "$line" "$value" "case $word in"
    fi
  fi
}
declare -x __RS_LINE=0
command_not_found_handle() {
  local -
  set +x
  local token="@@rigsmith-output-$BASHPID@@"
  __rs_rec O "$__RS_LINE" "$token" "$@"
  printf '%s' "$token"
  return "${__RS_STATUS:-0}"
}
cd() {
  local -
  set +x
  __rs_rec C "$__RS_LINE" cd "$@"
  return 0
}
pushd() { cd "$@"; }
popd() { return 0; }
__rs_source() {
  local -
  set +x
  if [[ -f ${2-} && ${2-} != /rs/* ]]; then
    set -ux
    builtin source "${@:2}"
    return
  fi
  __rs_rec S "$__RS_LINE" "$@"
  return 0
}
source() { __rs_source source "$@"; }
.() { __rs_source . "$@"; }
PS4=$'\x1d${LINENO}\x1f'
BASH_XTRACEFD=$__RS_XFD
set -uT
trap '__rs_dbg "$LINENO" "$@" && set -ux' DEBUG
# At the end, bash waits for what the text started in the background, children and their children alike
# (pid 1 is bubblewrap's init, the other is this shell): a process that runs on is the wall clock's.
__rs_drain() {
  local - entries
  set +fux
  wait
  while :; do
    entries=(/proc/[0-9]*)
    ((${#entries[@]} <= 2)) && return 0
  done
}
if [[ -z ${__RS_NESTED-} ]]; then
  export __RS_NESTED=1
  trap __rs_drain EXIT
else # a bash the text runs (bash -c): its own background jobs only; the outermost bash waits for the rest
  trap 'set +ux; wait' EXIT
fi
set -x
