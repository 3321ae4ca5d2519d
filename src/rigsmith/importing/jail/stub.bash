#!/usr/bin/bash -p
# Every command a recipe runs in rigsmith's import jail, by the name it is called as (see bashjail.py):
# a launcher records its argv and exported environment; a wrapper records itself and runs what it wraps;
# anything else records its argv and prints a token that marks its output.
# shellcheck disable=SC2163  # export "$1" exports the NAME=value word it holds
set -f
__rs_rec() {
  local kind=$1 line=$2
  shift 2
  printf '%s\0' "$kind" "$line" "$#" "$@" >&"$__RS_RFD"
} 2>/dev/null
name=${0##*/}
line=${__RS_LINE:-0}
# A launcher: its argv and the environment exported to it.
launched() {
  local n envs=()
  for n in $(compgen -e); do
    case $n in PATH | PWD | OLDPWD | SHLVL | _ | BASH_ENV | __RS_*) continue ;; esac
    [[ $n == HOME && $HOME == '~' ]] && continue
    envs+=("$n=${!n}")
  done
  __rs_rec L "$line" "$#" "$@" "${envs[@]}"
  exit 0
}
# A Python that runs a vLLM module launches; one that runs anything else (``-c CODE``, a script, another
# module: a Hub login before the server) is a command outside the launchers, like any other.
vllm_module() {
  while [[ $# -gt 0 ]]; do
    case $1 in
    -m) [[ ${2-} == vllm || ${2-} == vllm.* ]]; return ;;
    -[WX]) shift 2 ;;
    -[bBdEiIOPqsSuvx]* | -[WX]?*) shift ;;
    *) return 1 ;;
    esac
  done
  return 1
}
case $name in
python | python[23] | python[23].[0-9]*)
  if vllm_module "$@"; then launched "$0" "$@"; fi
  set -- "$0" "$@"
  name=
  ;;
vllm | docker | podman | ray | run_cluster.sh) launched "$0" "$@" ;;
sudo)
  all=("$@")
  while [[ ${1-} == -* ]]; do
    case $1 in
    --) shift; break ;;
    -[ugCDhprtUT] | --user | --group | --chdir | --host | --prompt | --role | --type | --other-user | --command-timeout) shift 2 ;;
    *) shift ;;
    esac
  done
  words=(sudo "${all[@]:0:${#all[@]}-$#}")
  __rs_rec W "$line" "${words[*]}"
  while [[ ${1-} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do export "$1"; shift; done
  ;;
nohup)
  __rs_rec W "$line" nohup
  [[ ${1-} == -- ]] && shift
  ;;
env)
  if [[ $# -gt 0 ]]; then __rs_rec W "$line" env; fi
  while [[ $# -gt 0 ]]; do
    case $1 in
    --) shift; break ;;
    -i | --ignore-environment)
      for n in $(compgen -e); do
        case $n in PATH | BASH_ENV | __RS_*) ;; *) export -n "$n" ;; esac
      done
      shift ;;
    -u | --unset) unset "$2"; shift 2 ;;
    -*) break ;;
    *=*) [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || break; export "$1"; shift ;;
    *) break ;;
    esac
  done
  ;;
uv)
  if [[ ${1-} == run ]]; then
    all=("$@")
    shift
    while [[ ${1-} == -* && $1 != -m && $1 != --module ]]; do
      case $1 in
      --with | --with-editable | --with-requirements | --python | -p | --project | --directory | --env-file | \
        --extra | --group | --index | --default-index | --index-url | --extra-index-url | --package) shift 2 ;;
      *) shift ;;
      esac
    done
    words=(uv "${all[@]:0:${#all[@]}-$#}")
    __rs_rec W "$line" "${words[*]}"
  else
    set -- uv "$@"
    name=
  fi
  ;;
bash | sh | dash | zsh)
  [[ ${1-} == -c ]] && __rs_rec W "$line" "$name -c"
  # vLLM's examples/online_serving/run_cluster.sh, which the text names but does not hold: a launcher
  [[ ${1-} == run_cluster.sh || ${1-} == */run_cluster.sh ]] && ! [[ -f $1 ]] && launched "$name" "$@"
  exec /usr/bin/bash "$@"
  ;;
*) set -- "$0" "$@"; name= ;;
esac
if [[ -n $name && $# -gt 0 ]]; then
  exec "$@"
fi
[[ -n $name ]] && set -- "$name"
token="@@rigsmith-output-$$@@"
__rs_rec O "$line" "$token" "$@"
printf '%s' "$token"
exit "${__RS_STATUS:-0}"
