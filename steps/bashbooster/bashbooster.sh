# shellcheck shell=bash
# bashbooster.sh: the bash helpers Deckhouse's NodeGroupConfiguration scripts expect ("bb-*"),
# written for this project. Same names, arguments, exit codes and effects as Deckhouse's
# bashbooster; the differences left are listed in docs/deckhouse-compatibility.md.
#
# A step is run as Deckhouse runs it:
#   bash --noprofile --norc -eEo pipefail -c 'cd /var/lib/bashible; source bashbooster.sh; source STEP'
# Sourcing this file sets up the step's workspace and an EXIT trap that runs delayed event
# handlers and cleans up (as Deckhouse's does), so a step must not replace the EXIT trap.
#
# Environment read (all optional):
#   BASHIBLE_STATE_DIR   the agent's state directory (default /var/lib/bashible)
#   BB_WORKSPACE         flags and temporary files (default $BASHIBLE_STATE_DIR/.bb-workspace);
#                        flags live in $BB_WORKSPACE/flag, as in Deckhouse
#   BASHIBLE_ROOT        sandbox root; /etc/os-release is read under it
#   BB_OS_RELEASE        os-release file to read instead
#   BB_LOG_LEVEL         DEBUG, INFO (default), WARNING, ERROR, or 1..4
#   BASHIBLE_STEP        the step's name: the log prefix outside bb-* functions
#   BASHIBLE_AGENT       the agent's command (a path, or its argv as shell-quoted words):
#                        bb-package-install/-remove and the disruption approval call it
#                        (`package install|remove`, `internal-disruption`)
#   BASHIBLE_HTTP_PROXY, BASHIBLE_HTTPS_PROXY, BASHIBLE_NO_PROXY   what bb-set-proxy exports
#   FIRST_BASHIBLE_RUN   yes on the node's first run (no disruption approval then)
#   D8_NODE_HOSTNAME     the node's name

# ---- constants, small helpers -----------------------------------------------------------------

# shellcheck disable=SC2034 # Deckhouse's exit codes, for scripts that test them
BB_ERROR_ASSERT_FAILED=10
BB_ERROR_WORKSPACE_CREATION_FAILED=11
BB_ERROR_EVENT_MAX_DEPTH_REACHED=12
# shellcheck disable=SC2034
BB_ERROR_TASK_BAD_CONTEXT=13
# shellcheck disable=SC2034
BB_ERROR_TASK_UNDEFINED=14
BB_ERROR=0
BB_EXIT_CODE=0
BB_EVENT_MAX_DEPTH=1000

# bb-var NAME DEFAULT: sets NAME to DEFAULT unless it already has a non-empty value.
bb-var() {
    if [[ -z "${!1:-}" ]]; then
        printf -v "$1" '%s' "$2"
    fi
}

# _bb_exe_p CMD: whether CMD can be run (a command, function or builtin).
_bb_exe_p() {
    type -t "$1" >/dev/null
}

# bb-error?: whether the previous command failed; keeps its status in BB_ERROR.
bb-error?() {
    BB_ERROR=$?
    ((BB_ERROR != 0))
}

bb-var BASHIBLE_STATE_DIR "/var/lib/bashible"
bb-var BB_WORKSPACE "$BASHIBLE_STATE_DIR/.bb-workspace"
bb-var BB_LOG_LEVEL "INFO"
bb-var BB_SYNC_UNHANDLED_FILES_STORE "$BASHIBLE_STATE_DIR/bashbooster_unhandled_synced_files"
bb-var BB_APT_UNHANDLED_PACKAGES_STORE "$BASHIBLE_STATE_DIR/bashbooster_unhandled_packages"
bb-var BB_YUM_UNHANDLED_PACKAGES_STORE "$BB_APT_UNHANDLED_PACKAGES_STORE"
bb-var BB_DNF_UNHANDLED_PACKAGES_STORE "$BB_APT_UNHANDLED_PACKAGES_STORE"
bb-var BB_ZYPPER_UNHANDLED_PACKAGES_STORE "$BB_APT_UNHANDLED_PACKAGES_STORE"
BB_YUM_INSTALL_EXTRA_ARGS="${BB_YUM_INSTALL_EXTRA_ARGS:-}"
BB_DNF_INSTALL_EXTRA_ARGS="${BB_DNF_INSTALL_EXTRA_ARGS:-}"
BB_ZYPPER_INSTALL_EXTRA_ARGS="${BB_ZYPPER_INSTALL_EXTRA_ARGS:-}"

# ---- logging ----------------------------------------------------------------------------------
# "<prefix> [LEVEL] message" on stderr. The prefix is "bb-<area>" inside a helper (bb-flag,
# bb-sync, …), else the step's name.

# Logging and events are on every helper's path and events recurse: they compute their values
# into variables instead of $(...), which forks the whole (possibly deep) shell every call.

# _bb_log_code LEVEL: the numeric level of LEVEL, in _BB_LOG_CODE.
_bb_log_code() {
    case "${1^^}" in
        1 | DEBUG) _BB_LOG_CODE=1 ;;
        2 | INFO) _BB_LOG_CODE=2 ;;
        3 | WARNING | WARN) _BB_LOG_CODE=3 ;;
        4 | ERROR) _BB_LOG_CODE=4 ;;
        *) _BB_LOG_CODE=2 ;;
    esac
}

# _bb_log_prefix: who is logging, in _BB_LOG_PREFIX: the helper's area (bb-flag), else the step.
_bb_log_prefix() {
    # Indexed, not "${FUNCNAME[@]:2}": that copies the whole call stack on every line logged.
    local f i n=${#FUNCNAME[@]}
    for ((i = 2; i < n; i++)); do
        f=${FUNCNAME[i]}
        case "$f" in
            bb-log* | bb-exit* | bb-cleanup | _bb_*) continue ;;
            bb-*)
                local rest="${f#bb-}"
                _BB_LOG_PREFIX="bb-${rest%%-*}"
                return
                ;;
            *) break ;;
        esac
    done
    _BB_LOG_PREFIX="${BB_LOG_PREFIX:-${BASHIBLE_STEP:-${0##*/}}}"
}

_bb_log() {
    local code=$1 level=$2
    shift 2
    _bb_log_code "$BB_LOG_LEVEL"
    if ((code >= _BB_LOG_CODE)); then
        _bb_log_prefix
        printf '%s [%s] %s\n' "$_BB_LOG_PREFIX" "$level" "$*" >&2
    fi
}

bb-log-debug() { _bb_log 1 DEBUG "$@"; }
bb-log-info() { _bb_log 2 INFO "$@"; }
bb-log-warning() { _bb_log 3 WARNING "$@"; }
bb-log-warn() { _bb_log 3 WARNING "$@"; }
bb-log-error() { _bb_log 4 ERROR "$@"; }

# bb-log-deprecated ALTERNATIVE [CURRENT]
bb-log-deprecated() {
    bb-log-warning "'${2:-${FUNCNAME[1]}}' is deprecated, use '$1' instead"
}

bb-log-callstack() {
    local i msg="Call stack is:"
    for ((i = ${1:-1}; i < ${#FUNCNAME[@]}; i++)); do
        msg+=$'\n\t'"${BASH_SOURCE[$i]}:${BASH_LINENO[$((i - 1))]}"$'\t'"${FUNCNAME[$i]}()"
    done
    bb-log-debug "$msg"
}

# bb-exit CODE MESSAGE: logs (error unless CODE is 0) and exits the step with CODE.
bb-exit() {
    local code=$(($1))
    if ((code == 0)); then
        bb-log-info "$2"
    else
        bb-log-error "$2"
        bb-log-callstack 2
    fi
    BB_EXIT_CODE=$code
    exit "$code"
}

# bb-exit-on-error MESSAGE: exits with the previous command's status if it failed.
bb-exit-on-error() {
    local status=$?
    if ((status != 0)); then
        BB_ERROR=$status
        bb-exit "$status" "$1"
    fi
}

# ---- workspace and temporary files ------------------------------------------------------------

bb-workspace-init() {
    mkdir -p "$BB_WORKSPACE" 2>/dev/null ||
        bb-exit "$BB_ERROR_WORKSPACE_CREATION_FAILED" "Failed to initialize workspace at '$BB_WORKSPACE'"
    BB_WORKSPACE="$(cd "$BB_WORKSPACE" && pwd)"
}

bb-workspace-cleanup() {
    rmdir "$BB_WORKSPACE" 2>/dev/null || true
}

bb-tmp-name() {
    echo "$(date +%s%N)$RANDOM"
}

bb-tmp-init() {
    BB_TMP_DIR="$(mktemp -d "$BB_WORKSPACE/tmp_XXXXXXXX")"
}

# bb-tmp-file: creates an empty file (mode from the umask, as `touch` makes it) and prints its path.
bb-tmp-file() {
    local name i
    for ((i = 0; i < 8; i++)); do
        name="$BB_TMP_DIR/$(bb-tmp-name)"
        if (set -C && : >"$name") 2>/dev/null; then
            echo "$name"
            return 0
        fi
    done
    bb-log-error "cannot create a temporary file in $BB_TMP_DIR"
    return 1
}

# bb-tmp-dir: creates a directory and prints its path.
bb-tmp-dir() {
    mktemp -d "$BB_TMP_DIR/XXXXXXXXXX"
}

bb-tmp-cleanup() {
    rm -rf "${BB_TMP_DIR:?}"
}

# ---- events -----------------------------------------------------------------------------------
# Handlers are kept in files (as Deckhouse keeps them), so one registered in a subshell counts.
# bb-event-fire runs the handlers at once; bb-event-delay (and bb-sync-file's trailing event)
# runs them when the step ends, whether it succeeded or not, once per distinct event and args.

declare -A BB_EVENT_DEPTH=()

bb-event-init() {
    BB_EVENT_DIR="$(bb-tmp-dir)"
}

# _bb_event_file EVENT: the file of EVENT's handlers, in _BB_EVENT_FILE.
_bb_event_file() {
    if [[ -z "$1" || "$1" == */* || "$1" == .* ]]; then
        bb-log-error "invalid event name '$1'"
        return 1
    fi
    _BB_EVENT_FILE="$BB_EVENT_DIR/$1.handlers"
}

# bb-event-on EVENT HANDLER: HANDLER (a command line) runs on EVENT, with the event's arguments.
bb-event-on() {
    local file
    _bb_event_file "$1" || return 1
    file=$_BB_EVENT_FILE
    touch "$file"
    if ! grep -Fxq -- "$2" "$file"; then
        bb-log-debug "Subscribed handler '$2' on event '$1'"
        printf '%s\n' "$2" >>"$file"
    fi
}

# bb-event-off EVENT HANDLER
bb-event-off() {
    local file
    _bb_event_file "$1" || return 1
    file=$_BB_EVENT_FILE
    if [[ -f "$file" ]]; then
        bb-log-debug "Removed handler '$2' from event '$1'"
        local rest
        rest="$(grep -Fxv -- "$2" "$file" || true)"
        printf '%s\n' "$rest" | sed '/^$/d' >"$file"
    fi
}

# bb-event-fire EVENT [ARGS...]: runs EVENT's handlers now, each with ARGS.
bb-event-fire() {
    (($#)) || return 0
    local event=$1
    shift
    local file
    _bb_event_file "$event" || return 1
    file=$_BB_EVENT_FILE
    BB_EVENT_DEPTH[$event]=$((${BB_EVENT_DEPTH[$event]:-0} + 1))
    if ((BB_EVENT_DEPTH[$event] >= BB_EVENT_MAX_DEPTH)); then
        bb-exit "$BB_ERROR_EVENT_MAX_DEPTH_REACHED" "Max recursion depth has been reached on processing event '$event'"
    fi
    if [[ -s "$file" ]]; then
        bb-log-info "Run handlers for event '$event'"
        local handlers handler
        mapfile -t handlers <"$file"
        for handler in "${handlers[@]}"; do
            [[ -n "$handler" ]] || continue
            eval "$handler \"\$@\""
        done
    fi
    BB_EVENT_DEPTH[$event]=$((BB_EVENT_DEPTH[$event] - 1))
}

# bb-event-delay EVENT [ARGS...]: fire EVENT with ARGS when the step ends (once, however often delayed).
bb-event-delay() {
    (($#)) || return 0
    _bb_event_file "$1" || return 1
    local line
    line="$(printf '%q ' "$@")"
    touch "$BB_EVENT_DIR/events"
    if ! grep -Fxq -- "$line" "$BB_EVENT_DIR/events"; then
        bb-log-debug "Delayed event '$line'"
        printf '%s\n' "$line" >>"$BB_EVENT_DIR/events"
    fi
}

# bb-event-cleanup: fires the delayed events (and those their handlers delay in turn).
bb-event-cleanup() {
    local rounds=0 events line
    while [[ -s "$BB_EVENT_DIR/events" ]]; do
        if ((++rounds >= BB_EVENT_MAX_DEPTH)); then
            rm -f "$BB_EVENT_DIR/events"
            bb-log-error "Max recursion depth has been reached on processing delayed events"
            return "$BB_ERROR_EVENT_MAX_DEPTH_REACHED"
        fi
        mapfile -t events <"$BB_EVENT_DIR/events"
        rm -f "$BB_EVENT_DIR/events"
        for line in "${events[@]}"; do
            eval "bb-event-fire $line"
        done
    done
}

# ---- flags ------------------------------------------------------------------------------------
# Files in $BB_WORKSPACE/flag; they outlive the step (the agent reads reboot and disruption).

bb-flag-init() {
    BB_FLAG_DIR="$BB_WORKSPACE/flag"
}

_bb_flag_name() {
    if [[ -z "$1" || "$1" == */* || "$1" == .* ]]; then
        bb-log-error "invalid flag name '$1'"
        return 1
    fi
}

_bb_flag_p() {
    _bb_flag_name "$1" || return 1
    [[ -f "$BB_FLAG_DIR/$1" ]]
}

bb-flag-set() {
    _bb_flag_name "$1" || return 1
    if [[ ! -d "$BB_FLAG_DIR" ]]; then
        bb-log-debug "Creating flag directory at '$BB_FLAG_DIR'"
        mkdir -p "$BB_FLAG_DIR"
    fi
    bb-log-info "Creating flag '$1' at '$BB_FLAG_DIR'"
    touch "$BB_FLAG_DIR/$1"
}

bb-flag-unset() {
    _bb_flag_name "$1" || return 1
    rm -f "$BB_FLAG_DIR/$1"
}

bb-flag-clean() {
    bb-log-debug "Removing flag directory"
    rm -rf "${BB_FLAG_DIR:?}"
}

# bb-flag-cleanup: removes the flag directory when no flag is left in it.
bb-flag-cleanup() {
    rmdir "$BB_FLAG_DIR" 2>/dev/null || true
}

# ---- files ------------------------------------------------------------------------------------
# bb-sync-file and bb-sync-dir keep the agent's own link rule (README "Security",
# host/confined.ts): they run as root on machines with untrusted users, so they never write,
# chmod, chown or delete through a link in the destination, and only work where nobody but root
# can create or swap a name:
#   - every directory on the way to the destination is a real directory owned by root (or by
#     the agent's own user), which nobody else can write; a root-owned sticky directory (/tmp)
#     counts on the way, since nobody else can rename or remove what root owns in it;
#   - the directory a file lands in, and every directory bb-sync-dir fills or empties, nobody
#     but root can write at all (sticky or not);
#   - a link at any component is refused with its path and target, except the links real
#     systems ship (the agent's SYSTEM_LINKS: /bin, /lib, /var/run, …) when root owns them in a
#     directory only root can write; they resolve inside BASHIBLE_ROOT, as a chroot would;
#   - a file is written as a new file beside the destination (mktemp: O_EXCL, root's own) and
#     renamed over it, so a link or hard link planted at the destination is replaced, never
#     followed; a symlink already there is refused.
# Below BASHIBLE_ROOT only its inside is checked (the root is the operator's choice, as --root is
# the agent's).

_BB_SYSTEM_LINKS=" /bin /sbin /lib /lib32 /lib64 /libx32 /var/lock /var/run /etc/os-release /etc/mtab "

# _bb_sync_refuse WHAT: logs a refusal, named after the helper the step called.
_bb_sync_refuse() {
    local f i who=bb-sync
    for ((i = 1; i < ${#FUNCNAME[@]}; i++)); do
        f=${FUNCNAME[i]}
        if [[ "$f" == bb-sync-file || "$f" == bb-sync-dir ]]; then
            who=$f
            break
        fi
    done
    bb-log-error "$who: $1"
}

# _bb_split PATH [lexical]: PATH's components in _BB_NAMES. ".." is refused (a destination names
# a place, it does not climb), unless `lexical` (a system link's target): then it removes the
# component before it, never climbing above the start.
_bb_split() {
    local rest=$1 name
    _BB_NAMES=()
    while [[ -n "$rest" ]]; do
        rest=${rest#/}
        [[ -n "$rest" ]] || break
        name=${rest%%/*}
        rest=${rest#"$name"}
        case "$name" in
            . | "") ;;
            ..)
                if [[ "${2:-}" != lexical ]]; then
                    _bb_sync_refuse "'$1' contains '..'; refused: name the destination without climbing"
                    return 1
                fi
                if ((${#_BB_NAMES[@]})); then unset '_BB_NAMES[-1]'; fi
                ;;
            *) _BB_NAMES+=("$name") ;;
        esac
    done
}

# _bb_dir_trusted UID MODE STRICT: whether only root (or the agent's own user) can create or
# replace names in a directory with this owner and mode; without STRICT, a sticky directory
# owned by root also counts (for what root owns in it).
_bb_dir_trusted() {
    if (($1 != 0 && $1 != EUID)); then return 1; fi
    if ((($2 & 8#022) == 0)); then return 0; fi
    [[ "$3" != strict ]] && (($2 & 8#1000))
}

# _bb_refuse_untrusted PATH UID MODE: refuses PATH, saying who can write it and why that is refused.
_bb_refuse_untrusted() {
    local msg
    printf -v msg '%s can be written by others (owner uid %s, mode %04o); refused: the sync helpers write only where nobody but root can create or replace names (use a directory only root can write)' \
        "$1" "$2" $(($3 & 8#7777))
    _bb_sync_refuse "$msg"
}

# _bb_refuse_link PATH TARGET: refuses the symbolic link PATH (to TARGET).
_bb_refuse_link() {
    _bb_sync_refuse "$1 is a symbolic link (to $2); refused: the sync helpers never write through a link (remove it, or name the real path)"
}

# _bb_root_only_dir PATH: whether PATH is a directory only root can write (else refused, saying why).
_bb_root_only_dir() {
    local out uid mode
    out=$(stat -c '%u %f' -- "$1") || return 1
    uid=${out%% *} mode=$((16#${out#* }))
    if (((mode & 8#170000) != 8#040000)); then
        _bb_sync_refuse "$1 exists and is not a directory"
        return 1
    fi
    if ! _bb_dir_trusted "$uid" "$mode" strict; then
        _bb_refuse_untrusted "$1" "$uid" "$mode"
        return 1
    fi
}

# _bb_walk DIR need|create: resolves the directory DIR by the rule above; its real path (system
# links resolved) in _BB_WALK_DIR. Returns 1 after logging why it refused, 2 when DIR (or a
# directory on the way) is missing and not to be created. One `stat` serves a whole path.
_bb_walk() {
    local want=$1 create=$2 root=${BASHIBLE_ROOT:-}
    root=${root%/}
    [[ "$want" == /* ]] || want="$PWD/$want"
    if [[ "$want" == *$'\n'* ]]; then
        _bb_sync_refuse "a destination with a newline in its name is refused"
        return 1
    fi
    if [[ -n "$root" && "$want" != "$root" && "$want" != "$root/"* ]]; then root=""; fi
    _bb_split "${want#"$root"}" || return 1
    local -a names=("${_BB_NAMES[@]}") prefixes lines
    local cur=$root cur_strict root_strict=no hops=0 out line uid mode k j n p next node target rest strict=""
    out=$(stat -c '%u %f' -- "${root:-/}") || {
        _bb_sync_refuse "${root:-/} cannot be read"
        return 1
    }
    uid=${out%% *} mode=$((16#${out#* }))
    ((${#names[@]})) || strict=strict
    if ! _bb_dir_trusted "$uid" "$mode" "$strict"; then
        _bb_refuse_untrusted "${root:-/}" "$uid" "$mode"
        return 1
    fi
    _bb_dir_trusted "$uid" "$mode" strict && root_strict=yes
    cur_strict=$root_strict
    while ((${#names[@]})); do
        prefixes=() p=$cur
        for n in "${names[@]}"; do
            p+="/$n"
            prefixes+=("$p")
        done
        # Lines only for the paths that exist: the missing ones are a tail (nothing exists under
        # a missing directory, and the walk stops at the first link).
        out=$(stat -c '%u %f' -- "${prefixes[@]}" 2>/dev/null) || true
        lines=()
        [[ -z "$out" ]] || mapfile -t lines <<<"$out"
        k=0
        while ((k < ${#lines[@]})); do
            line=${lines[k]} next=${prefixes[k]}
            uid=${line%% *} mode=$((16#${line#* }))
            if (((mode & 8#170000) == 8#120000)); then
                target=$(readlink -- "$next") || target="?"
                node=${next#"$root"}
                if [[ "$_BB_SYSTEM_LINKS" != *" $node "* || "$uid" != 0 || "$cur_strict" != yes ]]; then
                    _bb_refuse_link "$next" "$target"
                    return 1
                fi
                if ((++hops > 16)); then
                    _bb_sync_refuse "$next: too many levels of links"
                    return 1
                fi
                # Inside the root, lexically, as the agent resolves it: absolute targets start
                # at the root, relative ones at the link's directory; then the rest of the path.
                rest=""
                for ((j = k + 1; j < ${#names[@]}; j++)); do rest+="/${names[j]}"; done
                if [[ "$target" == /* ]]; then
                    _bb_split "$target$rest" lexical
                else
                    _bb_split "${cur#"$root"}/$target$rest" lexical
                fi
                names=("${_BB_NAMES[@]}")
                cur=$root cur_strict=$root_strict
                continue 2
            fi
            if (((mode & 8#170000) != 8#040000)); then
                _bb_sync_refuse "$next exists and is not a directory"
                return 1
            fi
            strict=""
            ((k + 1 < ${#names[@]})) || strict=strict
            if ! _bb_dir_trusted "$uid" "$mode" "$strict"; then
                _bb_refuse_untrusted "$next" "$uid" "$mode"
                return 1
            fi
            cur=$next cur_strict=no
            _bb_dir_trusted "$uid" "$mode" strict && cur_strict=yes
            k=$((k + 1))
        done
        names=("${names[@]:k}")
        if ((${#names[@]})); then
            if [[ "$create" != create ]]; then
                _BB_WALK_MISSING="$cur/${names[0]}"
                return 2
            fi
            # mkdir never follows a link at its last component; the next round checks what it made.
            mkdir -- "$cur/${names[0]}" || return 1
        fi
    done
    _BB_WALK_DIR=${cur:-/}
}

_bb_unhandled_has() {
    [[ -f "$1" ]] && grep -Fxq -- "$2" "$1"
}

_bb_unhandled_add() {
    mkdir -p "$(dirname -- "$1")"
    _bb_unhandled_has "$1" "$2" || printf '%s\n' "$2" >>"$1"
}

# bb-sync-file DEST SRC|- [EVENT [ARGS...]]: makes DEST a copy of SRC (stdin for -), with SRC's
# mode, owner and times. When DEST changed (or changed in an earlier run of this converge whose
# step failed before it ended), fires bb-sync-file-changed DEST at once and delays EVENT ARGS
# to the end of the step. DEST is replaced by a new file (rename), never written through; see
# the rule above for where DEST may be.
bb-sync-file() {
    if (($# < 2)); then
        bb-log-error "usage: bb-sync-file DEST SRC|- [EVENT [ARGS...]]"
        return 1
    fi
    local dst=$1 src=$2 rc=0
    shift 2
    if [[ "$src" == "-" ]]; then
        src="$(bb-tmp-file)"
        cat >"$src"
    elif [[ ! -f "$src" ]]; then
        bb-log-error "bb-sync-file: source '$src' is not a file"
        return 1
    fi
    [[ "$dst" == /* ]] || dst="$PWD/$dst"
    local name=${dst##*/} dir=${dst%/*}
    if [[ -z "$name" || "$name" == . || "$name" == .. ]]; then
        bb-log-error "bb-sync-file: '$dst' does not name a file"
        return 1
    fi
    _bb_walk "${dir:-/}" need || rc=$?
    if ((rc == 2)); then
        bb-log-error "bb-sync-file: directory $_BB_WALK_MISSING does not exist (create it first, or use bb-sync-dir)"
        return 1
    fi
    ((rc == 0)) || return 1
    _bb_sync_file_at "$_BB_WALK_DIR" "$name" "$src" "$dst" "$@"
}

# _bb_sync_file_at DIR NAME SRC SHOWN [EVENT [ARGS...]]: bb-sync-file into DIR (already walked)
# as NAME; SHOWN is the destination as the step named it (events, the unhandled store).
_bb_sync_file_at() {
    local dir=$1 name=$2 src=$3 shown=$4
    shift 4
    local target="${dir%/}/$name" tmp changed=false
    if [[ -L "$target" ]]; then
        _bb_refuse_link "$target" "$(readlink -- "$target" || echo '?')"
        return 1
    fi
    if [[ -e "$target" && ! -f "$target" ]]; then
        _bb_sync_refuse "$target exists and is not a regular file; refused"
        return 1
    fi
    _bb_unhandled_has "$BB_SYNC_UNHANDLED_FILES_STORE" "$shown" && changed=true
    if [[ ! -e "$target" ]] || ! cmp -s -- "$src" "$target"; then
        tmp=$(mktemp -- "${dir%/}/.bb-sync.XXXXXXXXXX") || {
            _bb_sync_refuse "cannot create a temporary file in $dir"
            return 1
        }
        # mv -T: a directory swapped in at the name is an error, never a place to move into.
        if ! cp -p -- "$src" "$tmp" || ! mv -f -T -- "$tmp" "$target"; then
            rm -f -- "$tmp"
            _bb_sync_refuse "cannot replace $target"
            return 1
        fi
        changed=true
        _bb_unhandled_add "$BB_SYNC_UNHANDLED_FILES_STORE" "$shown"
    fi
    if $changed; then
        bb-event-fire bb-sync-file-changed "$shown"
        bb-event-delay "$@"
    fi
}

# bb-sync-dir [-o|--one-way|-t|--two-way] DEST SRC [EVENT [ARGS...]]: syncs every file of SRC
# into DEST (bb-sync-file each). Two-way (the default) also removes from DEST what SRC lacks.
# The option may be any of the first three arguments. DEST and every directory under it that
# the sync fills or empties must be root's alone (the rule above).
bb-sync-dir() {
    local two_way=true args=() n=3
    while (($# && n--)); do
        case "$1" in
            -o | --one-way) two_way=false ;;
            -t | --two-way) two_way=true ;;
            *) args+=("$1") ;;
        esac
        shift
    done
    args+=("$@")
    if ((${#args[@]} < 2)); then
        bb-log-error "usage: bb-sync-dir [-o|-t] DEST SRC [EVENT [ARGS...]]"
        return 1
    fi
    if [[ ! -d "${args[1]}" ]]; then
        bb-log-error "bb-sync-dir: source '${args[1]}' is not a directory"
        return 1
    fi
    local dst=${args[0]} rc=0 created=false
    [[ "$dst" == /* ]] || dst="$PWD/$dst"
    _bb_walk "$dst" need || rc=$?
    if ((rc == 2)); then
        rc=0
        _bb_walk "$dst" create || rc=$?
        created=true
    fi
    ((rc == 0)) || return 1
    local src
    src="$(realpath -e -- "${args[1]}")"
    _bb_sync_dir_at "$two_way" "$created" "$_BB_WALK_DIR" "${dst%/}" "$src" "${args[@]:2}"
}

# _bb_sync_dir_at TWO_WAY CREATED DIR SHOWN SRC [EVENT [ARGS...]]: syncs SRC into DIR (walked,
# root's alone), shown to events as SHOWN.
_bb_sync_dir_at() {
    local two_way=$1 created=$2 dir=$3 shown=$4 src=$5 name entry
    shift 5
    if $created; then
        bb-event-delay "$@"
        bb-event-fire bb-sync-dir-created "$shown"
    fi
    # Listed through a file, not <(…): that needs /proc (for /dev/fd), which a chroot may lack.
    local names=() list
    list="$(bb-tmp-file)"
    find "$src" -mindepth 1 -maxdepth 1 -printf '%f\0' | sort -z >"$list"
    mapfile -d '' -t names <"$list"
    for name in "${names[@]}"; do
        if [[ -d "$src/$name" && ! -L "$src/$name" ]]; then
            entry="$dir/$name"
            if [[ -L "$entry" ]]; then
                _bb_refuse_link "$entry" "$(readlink -- "$entry" || echo '?')"
                return 1
            fi
            local sub_created=false
            if [[ ! -e "$entry" ]]; then
                mkdir -- "$entry" || return 1
                sub_created=true
            fi
            _bb_root_only_dir "$entry" || return 1
            _bb_sync_dir_at "$two_way" "$sub_created" "$entry" "$shown/$name" "$src/$name" "$@" || return 1
        elif [[ -f "$src/$name" ]]; then
            _bb_sync_file_at "$dir" "$name" "$src/$name" "$shown/$name" "$@" || return 1
        fi
    done
    if $two_way; then
        find "$dir" -mindepth 1 -maxdepth 1 -printf '%f\0' | sort -z >"$list"
        mapfile -d '' -t names <"$list"
        for name in "${names[@]}"; do
            [[ -e "$src/$name" || -L "$src/$name" ]] && continue
            entry="$dir/$name"
            local event=bb-sync-file-removed
            if [[ -d "$entry" && ! -L "$entry" ]]; then
                event=bb-sync-dir-removed
                # rm -r walks without following links; a tree another user can write into is
                # theirs to empty, not root's (the agent's rule for recursive removal).
                _bb_root_only_dir "$entry" || return 1
            fi
            # A link is removed itself (rm never follows the last component).
            rm -rf -- "$entry"
            bb-event-delay "$@"
            bb-event-fire "$event" "$shown/$name"
        done
    fi
}

# ---- OS: bundle, family, package manager ------------------------------------------------------
# os-release ID → Deckhouse's bundle; the same table as bundles/os-families.ts.

_bb_detect_os() {
    [[ -n "${BB_DETECTED_BUNDLE:-}" ]] && return 0
    local file="${BB_OS_RELEASE:-${BASHIBLE_ROOT:-}/etc/os-release}" id=""
    file="${file//\/\//\/}"
    if [[ -r "$file" ]]; then
        id="$(
            unset ID
            # shellcheck disable=SC1090
            . "$file" >/dev/null 2>&1
            echo "${ID:-}"
        )"
    fi
    BB_DETECTED_FAMILY="" BB_DETECTED_BUNDLE="" BB_DETECTED_PKG_MGR=""
    case "${id,,}" in
        ubuntu) BB_DETECTED_FAMILY=debian BB_DETECTED_BUNDLE=ubuntu-lts BB_DETECTED_PKG_MGR=apt ;;
        debian) BB_DETECTED_FAMILY=debian BB_DETECTED_BUNDLE=debian BB_DETECTED_PKG_MGR=apt ;;
        astra) BB_DETECTED_FAMILY=debian BB_DETECTED_BUNDLE=astra BB_DETECTED_PKG_MGR=apt ;;
        centos | rocky | almalinux | rhel | ol) BB_DETECTED_FAMILY=rhel BB_DETECTED_BUNDLE=centos BB_DETECTED_PKG_MGR=dnf ;;
        redos) BB_DETECTED_FAMILY=rhel BB_DETECTED_BUNDLE=redos BB_DETECTED_PKG_MGR=dnf ;;
        rosa | rels) BB_DETECTED_FAMILY=rhel BB_DETECTED_BUNDLE=rosa BB_DETECTED_PKG_MGR=dnf ;;
        opensuse-leap | mosos-arbat) BB_DETECTED_FAMILY=suse BB_DETECTED_BUNDLE=opensuse BB_DETECTED_PKG_MGR=zypper ;;
        altlinux) BB_DETECTED_FAMILY=altlinux BB_DETECTED_BUNDLE=altlinux BB_DETECTED_PKG_MGR=apt-rpm ;;
        *)
            if [[ -z "$id" ]]; then
                bb-log-warning "Can't determine OS! No ID in ${file}."
            else
                bb-log-warning "'$id' is not supported. Falling back to 'unknown'."
            fi
            BB_DETECTED_FAMILY=unknown BB_DETECTED_BUNDLE=unknown BB_DETECTED_PKG_MGR=unknown
            ;;
    esac
}

# One field of os-release, read in a subshell (the step's variables stay as they were).
_bb_os_field() {
    local file="${BB_OS_RELEASE:-${BASHIBLE_ROOT:-}/etc/os-release}"
    file="${file//\/\//\/}"
    [[ -r "$file" ]] || return 0
    (
        unset ID VERSION_ID
        # shellcheck disable=SC1090
        . "$file" >/dev/null 2>&1
        printf '%s\n' "${!1:-}"
    )
}

# bb-is-<os>-version? VERSION: VERSION_ID equals VERSION (Deckhouse compares only VERSION_ID for
# these three); bb-is-astra-version? REGEX: an Astra node whose VERSION_ID matches REGEX.
_bb_is_ubuntu_version_p() { [[ "$(_bb_os_field VERSION_ID)" == "$1" ]]; }
_bb_is_centos_version_p() { [[ "$(_bb_os_field VERSION_ID)" == "$1" ]]; }
_bb_is_debian_version_p() { [[ "$(_bb_os_field VERSION_ID)" == "$1" ]]; }
# ID or one of ID_LIKE names the distribution (bb-is-distro-like? debian on Ubuntu).
_bb_is_distro_like_p() { [[ " $(_bb_os_field ID) $(_bb_os_field ID_LIKE) " == *" $1 "* ]]; }
_bb_is_astra_version_p() { [[ "$(_bb_os_field ID)" == astra && "$(_bb_os_field VERSION_ID)" =~ $1 ]]; }

bb-is-bundle() {
    _bb_detect_os
    echo "$BB_DETECTED_BUNDLE"
}

bb-is-family() {
    _bb_detect_os
    echo "$BB_DETECTED_FAMILY"
}

bb-pkg-mgr() {
    _bb_detect_os
    echo "$BB_DETECTED_PKG_MGR"
}

# bb-pkg ACTION [ARGS...]: bb-<package manager>-ACTION ARGS (install, remove, package?, update, …).
bb-pkg() {
    if [[ -z "${1:-}" ]]; then
        bb-log-error "bb-pkg: action is required (e.g. install, remove, package?)"
        return 1
    fi
    local action=$1 manager
    shift
    manager="$(bb-pkg-mgr)"
    if ! declare -F "bb-$manager-$action" >/dev/null; then
        bb-log-error "bb-pkg: action '$action' is not supported for package manager '$manager'"
        return 1
    fi
    "bb-$manager-$action" "$@"
}

# ---- proxy ------------------------------------------------------------------------------------

bb-set-proxy() {
    if [[ -n "${BASHIBLE_HTTP_PROXY:-}${BASHIBLE_HTTPS_PROXY:-}" ]]; then
        if [[ -n "${BASHIBLE_HTTP_PROXY:-}" ]]; then
            export HTTP_PROXY="$BASHIBLE_HTTP_PROXY" http_proxy="$BASHIBLE_HTTP_PROXY"
        fi
        if [[ -n "${BASHIBLE_HTTPS_PROXY:-}" ]]; then
            export HTTPS_PROXY="$BASHIBLE_HTTPS_PROXY" https_proxy="$BASHIBLE_HTTPS_PROXY"
        fi
        local no_proxy_list="127.0.0.1,169.254.169.254${BASHIBLE_NO_PROXY:+,$BASHIBLE_NO_PROXY}"
        export NO_PROXY="$no_proxy_list" no_proxy="$no_proxy_list"
    else
        bb-unset-proxy
    fi
}

bb-unset-proxy() {
    unset HTTP_PROXY http_proxy HTTPS_PROXY https_proxy NO_PROXY no_proxy
}

# ---- apt (Debian, Ubuntu, Astra) --------------------------------------------------------------
# bb-*-install fires bb-package-installed once per call, with the last package named, when it
# installed something (or an earlier run did and failed before its step ended): Deckhouse's
# behaviour. Installed apt packages are held, as Deckhouse holds them.

_bb_apt_p() {
    _bb_exe_p apt-get
}

# _bb_apt_package_p NAME[=VERSION]: installed (at VERSION; `*` matches any run of version characters).
_bb_apt_package_p() {
    local name="${1%%=*}" version=""
    [[ "$1" == *=* ]] && version="${1#*=}"
    if [[ -z "$version" ]]; then
        dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q ' installed$'
    else
        local installed pattern
        installed="$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null)" || return 1
        [[ "$installed" == *" installed "* ]] || return 1
        installed="${installed##* }"
        pattern="^$(sed -e 's/[.+^$]/\\&/g' -e 's/\*/[a-zA-Z0-9_+~:.-]*/g' <<<"$version")\$"
        grep -q -- "$pattern" <<<"$installed"
    fi
}

_bb_apt_repo_p() {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | grep -v '^#' | grep -qw -- "$1"
}

bb-apt-repo-add() {
    local line="$*" domain
    domain="$(sed -E -e 's#.*https?://([^/ \t]+)/?.*#\1#' <<<"${2:-}")"
    if ! cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | sed -E -e 's/#.*//' | tr -s ' \t' ' ' |
        grep -Fxq -- "$(tr -s ' \t' ' ' <<<"$line")"; then
        echo "$line" >>"/etc/apt/sources.list.d/${domain:-bashible}.list"
        bb-flag-unset apt-updated
    fi
}

bb-apt-key-add() {
    apt-key add -
}

bb-apt-update() {
    export DEBIAN_FRONTEND=noninteractive
    _bb_flag_p apt-updated && return 0
    bb-log-info 'Updating apt cache'
    apt-get update
    bb-flag-set apt-updated
}

bb-apt-dist-upgrade() {
    export DEBIAN_FRONTEND=noninteractive
    bb-apt-update
    bb-log-info 'Processing dist-upgrade'
    apt-get -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold dist-upgrade -y
}

# As Deckhouse's (50_apt.sh): --force installs the packages even if present; nothing is held.
bb-apt-install() {
    export DEBIAN_FRONTEND=noninteractive
    local force=false
    if [[ "${1:-}" == --force ]]; then
        force=true
        shift
    fi
    local package need_fire=false missing=()
    for package in "$@"; do
        _bb_unhandled_has "$BB_APT_UNHANDLED_PACKAGES_STORE" "$package" && need_fire=true
        if $force || ! _bb_apt_package_p "$package"; then missing+=("$package"); fi
    done
    if ((${#missing[@]})); then
        bb-apt-update
        bb-log-info "Installing packages '${missing[*]}'"
        apt-get -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            install --allow-change-held-packages --allow-downgrades -y "${missing[@]}" ||
            bb-exit-on-error "Failed to install packages '${missing[*]}'"
        for package in "${missing[@]}"; do _bb_unhandled_add "$BB_APT_UNHANDLED_PACKAGES_STORE" "$package"; done
        need_fire=true
    fi
    if $need_fire; then
        bb-event-fire bb-package-installed "${*: -1}"
    fi
}

bb-apt-remove() {
    export DEBIAN_FRONTEND=noninteractive
    local package present=()
    for package in "$@"; do
        _bb_apt_package_p "$package" && present+=("$package")
    done
    if ((${#present[@]})); then
        bb-log-info "Removing packages '${present[*]}'"
        apt-get remove -y --allow-change-held-packages "${present[@]}" ||
            bb-exit-on-error "Failed to remove packages '${present[*]}'"
        for package in "${present[@]}"; do bb-event-fire bb-package-removed "$package"; done
    fi
}

bb-apt-autoremove() {
    export DEBIAN_FRONTEND=noninteractive
    bb-log-info 'Autoremoving unused packages'
    apt-get -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold --purge -y autoremove
}

_bb_apt_hold_p() {
    apt-mark showhold 2>/dev/null | grep -Fxq -- "$1"
}

bb-apt-hold() {
    local package
    for package in "$@"; do apt-mark hold "${package%%=*}" >/dev/null; done
}

bb-apt-unhold() {
    local package
    for package in "$@"; do apt-mark unhold "${package%%=*}" >/dev/null; done
}

# _bb_apt_cache_upgradable PACKAGE: whether apt's candidate differs from the installed version
# (apt and ALT's apt-rpm alike).
_bb_apt_cache_upgradable() {
    local out
    out="$(apt-cache policy "$1" | awk '/Installed: / { i = $2 } /Candidate: / { if (i != "(none)" && i != $2) print i " " $2 }')"
    [[ -n "$out" ]]
}

_bb_apt_package_upgrade_p() {
    export DEBIAN_FRONTEND=noninteractive
    bb-apt-update
    _bb_apt_cache_upgradable "$1"
}

bb-apt-upgrade() {
    export DEBIAN_FRONTEND=noninteractive
    local package
    for package in "$@"; do
        if _bb_apt_package_upgrade_p "$package"; then
            bb-log-info "Upgrading package '$package'"
            bb-event-fire bb-package-pre-upgrade "$package"
            apt-get upgrade -y "$package" || bb-exit-on-error "Failed to upgrade package '$package'"
            bb-event-fire bb-package-post-upgrade "$package"
        fi
    done
}

# ---- yum, dnf (CentOS and rebuilds, RED OS, ROSA) ---------------------------------------------

_bb_yum_p() {
    _bb_exe_p yum
}

_bb_yum_repo_p() {
    yum -C repolist | grep -Ewq -- "^(\W)*${1}"
}

_bb_yum_package_p() {
    yum -C list installed "$1" &>/dev/null
}

bb-yum-update() {
    _bb_flag_p yum-updated && return 0
    bb-set-proxy
    bb-log-info 'Updating yum cache'
    yum clean all
    yum makecache
    bb-unset-proxy
    bb-flag-set yum-updated
}

bb-yum-install() {
    local package need_fire=false missing=()
    for package in "$@"; do
        _bb_unhandled_has "$BB_YUM_UNHANDLED_PACKAGES_STORE" "$package" && need_fire=true
        _bb_yum_package_p "$package" || missing+=("$package")
    done
    if ((${#missing[@]})); then
        bb-yum-update
        bb-log-info "Installing packages '${missing[*]}'"
        bb-set-proxy
        # shellcheck disable=SC2086
        yum install $BB_YUM_INSTALL_EXTRA_ARGS -y "${missing[@]}" ||
            bb-exit-on-error "Failed to install packages '${missing[*]}'"
        bb-unset-proxy
        for package in "${missing[@]}"; do _bb_unhandled_add "$BB_YUM_UNHANDLED_PACKAGES_STORE" "$package"; done
        need_fire=true
    fi
    if $need_fire; then
        bb-event-fire bb-package-installed "${*: -1}"
    fi
}

bb-yum-remove() {
    local package
    for package in "$@"; do
        if _bb_yum_package_p "$package"; then
            bb-yum-update
            bb-log-info "Removing package '$package'"
            bb-set-proxy
            yum remove -y "$package" || bb-exit-on-error "Failed to remove package '$package'"
            bb-unset-proxy
        fi
    done
}

# bb-check-dnf: prints dnf, or yum where there is no dnf.
bb-check-dnf() {
    if _bb_exe_p dnf; then
        echo dnf
    elif _bb_exe_p yum; then
        echo yum
    else
        bb-log-error "found neither dnf nor yum"
        exit 1
    fi
}

_bb_dnf_p() {
    _bb_exe_p dnf
}

_bb_dnf_repo_p() {
    dnf repolist | grep -Ew -- "^(\W)*${1}"
}

_bb_dnf_package_p() {
    dnf list installed "$1" &>/dev/null
}

bb-dnf-update() {
    _bb_flag_p dnf-updated && return 0
    bb-set-proxy
    bb-log-info "Updating dnf cache"
    dnf clean all
    dnf makecache
    bb-unset-proxy
    bb-flag-set dnf-updated
}

bb-dnf-install() {
    if [[ "$(bb-check-dnf)" == yum ]]; then
        bb-log-info "bb-dnf-install downgraded to yum"
        bb-yum-install "$@"
        return
    fi
    local package need_fire=false missing=()
    for package in "$@"; do
        _bb_unhandled_has "$BB_DNF_UNHANDLED_PACKAGES_STORE" "$package" && need_fire=true
        _bb_dnf_package_p "$package" || missing+=("$package")
    done
    if ((${#missing[@]})); then
        bb-dnf-update
        bb-log-info "Installing packages '${missing[*]}'"
        bb-set-proxy
        # shellcheck disable=SC2086
        dnf install $BB_DNF_INSTALL_EXTRA_ARGS -y "${missing[@]}" ||
            bb-exit-on-error "Failed to install packages '${missing[*]}'"
        bb-unset-proxy
        for package in "${missing[@]}"; do _bb_unhandled_add "$BB_DNF_UNHANDLED_PACKAGES_STORE" "$package"; done
        need_fire=true
    fi
    if $need_fire; then
        bb-event-fire bb-package-installed "${*: -1}"
    fi
}

bb-dnf-remove() {
    if [[ "$(bb-check-dnf)" == yum ]]; then
        bb-log-info "bb-dnf-remove downgraded to yum"
        bb-yum-remove "$@"
        return
    fi
    local package
    for package in "$@"; do
        if _bb_dnf_package_p "$package"; then
            bb-dnf-update
            bb-log-info "Removing package '$package'"
            bb-set-proxy
            dnf remove -y "$package" || bb-exit-on-error "Failed to remove package '$package'"
            bb-unset-proxy
            bb-event-fire bb-package-removed "$package"
        fi
    done
}

# ---- apt-rpm (ALT Linux), zypper (openSUSE) ---------------------------------------------------

_bb_apt_rpm_p() {
    _bb_exe_p apt-get && _bb_exe_p rpm
}

_bb_apt_rpm_package_p() {
    rpm -q -- "${1%%=*}" &>/dev/null
}

bb-apt-rpm-update() {
    _bb_flag_p apt-rpm-updated && return 0
    bb-set-proxy
    bb-log-info 'Updating apt cache'
    apt-get update
    bb-unset-proxy
    bb-flag-set apt-rpm-updated
}

# The rest of Deckhouse's bb-apt-rpm-*: apt-get on ALT Linux, as the apt ones.
bb-apt-rpm-repo-add() {
    local line="$*" domain
    domain="$(sed -E -e 's#.*https?://([^/ \t]+)/?.*#\1#' <<<"${2:-}")"
    if ! cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | sed -E -e 's/#.*//' | tr -s ' \t' ' ' |
        grep -Fxq -- "$(tr -s ' \t' ' ' <<<"$line")"; then
        echo "$line" >>"/etc/apt/sources.list.d/${domain:-bashible}.list"
        bb-flag-unset apt-rpm-updated
    fi
}

bb-apt-rpm-dist-upgrade() {
    bb-apt-rpm-update
    bb-log-info 'Processing dist-upgrade'
    bb-set-proxy
    apt-get dist-upgrade -y
    bb-unset-proxy
}

bb-apt-rpm-autoremove() {
    bb-log-info 'Autoremoving unused packages'
    apt-get autoremove -y
}

_bb_apt_rpm_package_upgrade_p() {
    bb-apt-rpm-update
    _bb_apt_cache_upgradable "$1"
}

bb-apt-rpm-upgrade() {
    local package
    for package in "$@"; do
        if _bb_apt_rpm_package_upgrade_p "$package"; then
            bb-log-info "Upgrading package '$package'"
            bb-event-fire bb-package-pre-upgrade "$package"
            bb-set-proxy
            apt-get install -y "$package" || bb-exit-on-error "Failed to upgrade package '$package'"
            bb-unset-proxy
            bb-event-fire bb-package-post-upgrade "$package"
        fi
    done
}

# bb-apt-rpm-install [--force] PACKAGE...
bb-apt-rpm-install() {
    local force=false
    if [[ "${1:-}" == --force ]]; then
        force=true
        shift
    fi
    local package need_fire=false missing=()
    for package in "$@"; do
        _bb_unhandled_has "$BB_APT_UNHANDLED_PACKAGES_STORE" "$package" && need_fire=true
        if $force || ! _bb_apt_rpm_package_p "$package"; then missing+=("$package"); fi
    done
    if ((${#missing[@]})); then
        bb-apt-rpm-update
        bb-log-info "Installing packages '${missing[*]}'"
        bb-set-proxy
        apt-get install -y "${missing[@]}" || bb-exit-on-error "Failed to install packages '${missing[*]}'"
        bb-unset-proxy
        for package in "${missing[@]}"; do _bb_unhandled_add "$BB_APT_UNHANDLED_PACKAGES_STORE" "$package"; done
        need_fire=true
    fi
    if $need_fire; then
        bb-event-fire bb-package-installed "${*: -1}"
    fi
}

bb-apt-rpm-remove() {
    local package present=()
    for package in "$@"; do
        _bb_apt_rpm_package_p "$package" && present+=("$package")
    done
    if ((${#present[@]})); then
        bb-log-info "Removing packages '${present[*]}'"
        apt-get remove -y "${present[@]}" || bb-exit-on-error "Failed to remove packages '${present[*]}'"
        for package in "${present[@]}"; do bb-event-fire bb-package-removed "$package"; done
    fi
}

_bb_zypper_p() {
    _bb_exe_p zypper
}

_bb_zypper_package_p() {
    rpm -q -- "$1" &>/dev/null
}

bb-zypper-update() {
    _bb_flag_p zypper-updated && return 0
    bb-log-info 'Updating zypper cache'
    zypper clean
    zypper refresh
    bb-flag-set zypper-updated
}

bb-zypper-install() {
    local package need_fire=false missing=()
    for package in "$@"; do
        _bb_unhandled_has "$BB_ZYPPER_UNHANDLED_PACKAGES_STORE" "$package" && need_fire=true
        _bb_zypper_package_p "$package" || missing+=("$package")
    done
    if ((${#missing[@]})); then
        bb-zypper-update
        bb-log-info "Installing packages '${missing[*]}'"
        # shellcheck disable=SC2086
        zypper install $BB_ZYPPER_INSTALL_EXTRA_ARGS -y "${missing[@]}" ||
            bb-exit-on-error "Failed to install packages '${missing[*]}'"
        for package in "${missing[@]}"; do _bb_unhandled_add "$BB_ZYPPER_UNHANDLED_PACKAGES_STORE" "$package"; done
        need_fire=true
    fi
    if $need_fire; then
        bb-event-fire bb-package-installed "${*: -1}"
    fi
}

bb-zypper-remove() {
    local package
    for package in "$@"; do
        if _bb_zypper_package_p "$package"; then
            bb-zypper-update
            bb-log-info "Removing package '$package'"
            zypper remove -y "$package" || bb-exit-on-error "Failed to remove package '$package'"
        fi
    done
}

# bb-yum-or-apt-install PACKAGE...: whichever the node has.
bb-yum-or-apt-install() {
    if _bb_yum_p; then
        bb-yum-install "$@"
    elif _bb_apt_rpm_p; then
        bb-apt-rpm-install "$@"
    elif _bb_apt_p; then
        bb-apt-install "$@"
    else
        bb-log-error "Unsupported package manager"
        return 1
    fi
}

# ---- registry packages (through the agent) ----------------------------------------------------
# The agent fetches through the registry-packages proxy and verifies the digest; it writes one
# line per package to --result: "installed NAME", "skipped NAME" or "removed NAME", which fire
# bb-package-installed / bb-package-removed here, as Deckhouse's rpp-get result does.

# BASHIBLE_AGENT is the agent's command: an executable's path, or its argv as shell-quoted words
# ('/usr/bin/node' '/opt/bashible/main.ts'). Sets BB_AGENT_ARGV.
_bb_agent() {
    BB_AGENT_ARGV=()
    if [[ -n "${BASHIBLE_AGENT:-}" && -x "$BASHIBLE_AGENT" ]]; then
        BB_AGENT_ARGV=("$BASHIBLE_AGENT")
    elif [[ -n "${BASHIBLE_AGENT:-}" ]]; then
        eval "BB_AGENT_ARGV=($BASHIBLE_AGENT)" 2>/dev/null || BB_AGENT_ARGV=()
    fi
    if ((${#BB_AGENT_ARGV[@]} == 0)) || ! type -P -- "${BB_AGENT_ARGV[0]}" >/dev/null; then
        bb-log-error "${FUNCNAME[1]} needs the bashible agent (BASHIBLE_AGENT='${BASHIBLE_AGENT:-}' is not a command)"
        return 1
    fi
}

_bb_rp_fire_events() {
    local action name
    while read -r action name; do
        case "$action" in
            installed) bb-event-fire bb-package-installed "$name" ;;
            removed) bb-event-fire bb-package-removed "$name" ;;
        esac
    done <"$1"
}

# bb-package-install NAME:sha256:HEX[@REPOSITORY]...: installs registry packages (skipped when
# already at that digest; the repository defaults to the registry's <path>/packages).
bb-package-install() {
    (($#)) || return 0
    local arg
    for arg in "$@"; do
        if [[ ! "$arg" =~ ^[a-z0-9][a-z0-9._-]*:sha256:[0-9a-f]{64}(@[^[:space:]]+)?$ ]]; then
            bb-log-error "bb-package-install: '$arg' is not NAME:sha256:<64 hex>"
            return 1
        fi
    done
    _bb_agent || return 1
    local result rc=0
    result="$(bb-tmp-file)"
    "${BB_AGENT_ARGV[@]}" package install --result "$result" "$@" || rc=$?
    _bb_rp_fire_events "$result"
    return "$rc"
}

# bb-package-remove NAME...: runs each package's uninstall.
bb-package-remove() {
    (($#)) || return 0
    local arg
    for arg in "$@"; do
        if [[ ! "$arg" =~ ^[a-z0-9][a-z0-9._-]*$ ]]; then
            bb-log-error "bb-package-remove: '$arg' is not a package name"
            return 1
        fi
    done
    _bb_agent || return 1
    local result rc=0
    result="$(bb-tmp-file)"
    "${BB_AGENT_ARGV[@]}" package remove --result "$result" "$@" || rc=$?
    _bb_rp_fire_events "$result"
    return "$rc"
}

# bb-package-fetch NAME:DIGEST...: a prefetch in Deckhouse; here bb-package-install fetches, so
# this only checks its arguments.
bb-package-fetch() {
    local arg
    for arg in "$@"; do
        if [[ ! "$arg" =~ ^[a-z0-9][a-z0-9._-]*:sha256:[0-9a-f]{64}$ ]]; then
            bb-log-error "bb-package-fetch: '$arg' is not NAME:sha256:<64 hex>"
            return 1
        fi
    done
    bb-log-debug "bb-package-fetch: packages are fetched when installed"
}

# ---- Bash Booster's assert, template, read, wait, task and download helpers -------------------

# bb-assert EXPRESSION [MESSAGE]: the step ends with BB_ERROR_ASSERT_FAILED when EXPRESSION (a
# shell expression, evaluated) is false.
bb-assert() {
    local __assertion="$1"
    local __message="${2-Assertion error '$__assertion'}"
    if ! eval "$__assertion"; then
        bb-exit "$BB_ERROR_ASSERT_FAILED" "$__message"
    fi
}
bb-assert-root() { bb-assert '[[ $EUID -eq 0 ]]' "${1-This script must be run as root!}"; }
bb-assert-file() { bb-assert "[[ -f $(printf %q "$1") ]]" "${2-File '$1' not found}"; }
bb-assert-file-readable() { bb-assert "[[ -f $(printf %q "$1") && -r $(printf %q "$1") ]]" "${2-File '$1' is not readable}"; }
bb-assert-file-writeable() { bb-assert "[[ -f $(printf %q "$1") && -w $(printf %q "$1") ]]" "${2-File '$1' is not writeable}"; }
bb-assert-file-executable() { bb-assert "[[ -f $(printf %q "$1") && -x $(printf %q "$1") ]]" "${2-File '$1' is not executable}"; }
bb-assert-dir() { bb-assert "[[ -d $(printf %q "$1") ]]" "${2-Directory '$1' not found}"; }
bb-assert-var() { bb-assert "[[ -n \${$1-} ]]" "${2-Variable '$1' not set}"; }

# bb-template FILE: the file with its $VARIABLES and $(commands) expanded, as Deckhouse's does.
bb-template() {
    local __template="$1"
    eval "echo \"$(<"$__template")\""
}

# bb-read-properties FILE [PREFIX], bb-read-ini FILE [SECTION|*] [PREFIX], bb-read-json FILE
# [PREFIX], bb-read-yaml FILE [PREFIX]: set PREFIXkey=value variables from the file, with
# Deckhouse's naming (non-word characters become _, lists get NAME_len and NAME_<i>). Python 3
# reads them, as in Deckhouse (bb-read-yaml also needs PyYAML).
_bb_read() {
    local kind="$1" file="$2"
    shift 2
    if [[ ! -r "$file" ]]; then
        bb-log-error "'$file' is not readable"
        return 1
    fi
    if ! bb-exe? python3; then
        bb-log-error "${FUNCNAME[1]} needs python3"
        return 1
    fi
    local assignments
    assignments="$(python3 - "$kind" "$file" "$@" <<'PY'
import json, re, sys
kind, filename = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
word = lambda s: re.sub(r"[\W]", "_", str(s))
def quote(v):
    return "'" + str(v).replace("'", "'\\''") + "'"
def serialize(value, name):
    if value is None:
        print("%s=''" % name)
    elif isinstance(value, dict):
        for k, v in value.items():
            serialize(v, name + "_" + word(k))
    elif isinstance(value, list):
        print("%s_len=%d" % (name, len(value)))
        for i, v in enumerate(value):
            serialize(v, "%s_%d" % (name, i))
    else:
        if isinstance(value, bool):
            value = "True" if value else "False"
        print("%s=%s" % (name, quote(value)))
if kind == "properties":
    prefix = args[0] if args else ""
    for line in open(filename):
        m = re.match(r"^(?P<key>[^#!]*?)[\s:=]+(?P<value>.+)", line.strip())
        if m:
            print("%s%s=%s" % (prefix, word(m.group("key")), quote(m.group("value"))))
elif kind == "ini":
    import configparser
    section = args[0] if args else ""
    prefix = args[1] if len(args) > 1 else ""
    reader = configparser.ConfigParser(interpolation=None)
    reader.read(filename)
    for s in (reader.sections() if section in ("", "*") else [section]):
        for k, v in reader.items(s):
            print("%s%s_%s=%s" % (prefix, word(s), word(k), quote(v)))
else:
    prefix = args[0] if args else ""
    with open(filename) as f:
        if kind == "json":
            data = json.load(f)
        else:
            import yaml
            data = yaml.safe_load(f)
    serialize(data, prefix)
PY
)" || { bb-log-error "cannot read '$file' as $kind"; return 1; }
    eval "$assignments"
}
bb-read-properties() { _bb_read properties "$@"; }
bb-read-ini() { _bb_read ini "$@"; }
bb-read-json() { _bb_read json "$@"; }
bb-read-yaml() { _bb_read yaml "$@"; }
bb-properties-read() {
    bb-log-deprecated bb-read-properties bb-properties-read
    bb-read-properties "$@"
}

# bb-wait CONDITION [TIMEOUT]: evaluates CONDITION every second until it holds; with TIMEOUT
# (seconds) fails after that long.
bb-wait() {
    local __condition="$1" __timeout="${2:-}"
    local __counter=$((${__timeout:-0}))
    while ! eval "$__condition"; do
        sleep 1
        if [[ -n "$__timeout" ]]; then
            __counter=$((__counter - 1))
            if ((__counter <= 0)); then
                bb-log-error "Timeout has been reached during wait for '$__condition'"
                return 1
            fi
        fi
    done
}

# bb-task-def NAME [FUNCTION], bb-task-run NAME…, bb-task-depends NAME…: each task runs once per
# bb-task-run, its dependencies first.
declare -A BB_TASK_FUNCS=()
declare -a BB_TASK_CONTEXT=()
bb-task-def() {
    BB_TASK_FUNCS[$1]="${2-$1}"
}
bb-task-run() {
    BB_TASK_CONTEXT+=("$(bb-tmp-file)")
    bb-task-depends "$@"
    unset 'BB_TASK_CONTEXT[${#BB_TASK_CONTEXT[@]}-1]'
}
bb-task-depends() {
    local context="${BB_TASK_CONTEXT[${#BB_TASK_CONTEXT[@]}-1]:-}" name task code
    if [[ -z "$context" || ! -f "$context" ]]; then
        bb-exit "$BB_ERROR_TASK_BAD_CONTEXT" "Cannot run tasks. Bad context"
    fi
    for name in "$@"; do
        if ! grep -qxF -- "$name" "$context"; then
            bb-log-info "Running task '$name'..."
            task="${BB_TASK_FUNCS[$name]:-}"
            [[ -n "$task" ]] || bb-exit "$BB_ERROR_TASK_UNDEFINED" "Undefined task '$name'"
            code=0
            "$task" || code=$?
            ((code == 0)) || bb-exit "$code" "Task '$name' failed"
            bb-log-info "Task '$name' OK"
        fi
        echo "$name" >>"$context"
    done
}

# bb-download URL [NAME] [FORCE]: downloads into $BB_WORKSPACE/download (once, unless FORCE is
# true) and prints the file's path; bb-download-clean removes them. curl, or wget.
bb-download() {
    local url="$1" target force="${3:-false}"
    target="$BB_WORKSPACE/download/${2:-$(basename "$url")}"
    mkdir -p "$BB_WORKSPACE/download"
    echo "$target"
    if [[ -f "$target" ]] && ! $force; then return 0; fi
    bb-log-info "Downloading $url"
    if bb-exe? curl; then
        curl -fsSL -o "$target" -- "$url"
    else
        wget ${BB_DOWNLOAD_WGET_OPTIONS:--nv} -O "$target" -- "$url"
    fi || {
        rm -f "$target"
        bb-log-error "An error occurs while downloading $url"
        return 1
    }
}
bb-download-clean() { rm -rf "$BB_WORKSPACE/download"; }

# ---- users, containerd configuration, registry packages through the agent ---------------------

# bb-create_user_and_group USER UID GROUP GID: as Deckhouse's (30_user.sh): warns and leaves
# what exists, creates what is missing.
bb-create_user_and_group() {
    local username="$1" userid="$2" groupname="$3" groupid="$4"
    if id "$username" &>/dev/null && [[ "$(id -u "$username")" == "$userid" && "$(id -g "$username")" == "$groupid" ]]; then
        bb-log-warning "User $username with UID $userid and GID $groupid already exists. No changes needed."
        return 0
    fi
    bb-log-info "Creating user $username with UID $userid and GID $groupid"
    if getent passwd "$username" >/dev/null 2>&1; then
        bb-log-warning "User $username already exists"
        return 0
    fi
    if getent group "$groupname" >/dev/null 2>&1; then
        bb-log-warning "Group $groupname already exists"
    elif getent group "$groupid" >/dev/null 2>&1; then
        bb-log-warning "Group ID $groupid is already exists"
        groupname="$(getent group "$groupid" | cut -d: -f1)"
    else
        groupadd -g "$groupid" "$groupname"
    fi
    if getent passwd "$userid" >/dev/null 2>&1; then
        bb-log-warning "User ID $userid is already exists"
    else
        useradd -m -u "$userid" -g "$groupname" "$username"
    fi
}

# bb-ctrd-v1-has-registry-fields FILE / bb-ctrd-v2-has-registry-fields FILE: whether a
# containerd config (TOML) has the registry table of containerd 1.x (plugins."io.containerd.grpc.v1.cri".registry)
# or 2.x (plugins."io.containerd.cri.v1.images".registry). Exit 1 when not; the step ends when
# the file is not TOML. Read with Python 3's tomllib (Deckhouse uses yq).
_bb_ctrd_has_registry() {
    local plugin="$1" file="$2" r=0
    python3 - "$plugin" "$file" <<'PY' || r=$?
import sys
try:
    import tomllib
except ImportError:
    sys.exit(3)
with open(sys.argv[2], "rb") as f:
    try:
        doc = tomllib.load(f)
    except Exception:
        sys.exit(2)
sys.exit(0 if "registry" in doc.get("plugins", {}).get(sys.argv[1], {}) else 1)
PY
    case "$r" in
    0 | 1) return "$r" ;;
    3) bb-exit 1 "${FUNCNAME[1]} needs python3 ≥ 3.11 (tomllib)" ;;
    *) bb-exit 1 "ERROR: Failed to parse TOML config: $file" ;;
    esac
}
bb-ctrd-v1-has-registry-fields() { _bb_ctrd_has_registry io.containerd.grpc.v1.cri "$1"; }
bb-ctrd-v2-has-registry-fields() { _bb_ctrd_has_registry io.containerd.cri.v1.images "$1"; }

# Deckhouse's registry-package helpers, through the agent as bb-package-*: NAME:DIGEST, the
# digest sha256:HEX (or its 64 hex alone, as Deckhouse's tags are).
_bb_rp_ref() {
    local name="${1%%:*}" digest="${1#*:}"
    [[ "$digest" == sha256:* ]] || digest="sha256:$digest"
    echo "$name:$digest"
}
# _bb_rp_with COMMAND REF...: COMMAND with each REF in the agent's NAME:sha256:HEX form.
_bb_rp_with() {
    local cmd=$1 refs=() arg
    shift
    for arg in "$@"; do refs+=("$(_bb_rp_ref "$arg")"); done
    "$cmd" "${refs[@]}"
}
bb-rp-install() { _bb_rp_with bb-package-install "$@"; }
bb-rp-remove() { bb-package-remove "$@"; }
bb-rp-fetch() { _bb_rp_with bb-package-fetch "$@"; }
_bb_package_installed_p() {
    _bb_agent || return 1
    "${BB_AGENT_ARGV[@]}" package installed "$1" 2>/dev/null
}
# rpp-get is the agent here: nothing to install.
bb-rpp-get-install() { bb-log-debug "bb-rpp-get-install: the agent installs registry packages"; }

# ---- Deckhouse: node name, disruption approval ------------------------------------------------

bb-d8-node-name() {
    if [[ -s "$BASHIBLE_STATE_DIR/discovered-node-name" ]]; then
        echo "$(<"$BASHIBLE_STATE_DIR/discovered-node-name")"
    elif [[ -n "${D8_NODE_HOSTNAME:-}" ]]; then
        echo "$D8_NODE_HOSTNAME"
    else
        hostname
    fi
}

# bb-discover-node-name: records the node's name for bb-d8-node-name
# ($BASHIBLE_STATE_DIR/discovered-node-name), as Deckhouse's bashible does before the steps.
bb-discover-node-name() {
    if [[ ! -s "$BASHIBLE_STATE_DIR/discovered-node-name" ]]; then
        local name="${D8_NODE_HOSTNAME:-}"
        [[ -n "$name" ]] || name="$(hostname)"
        echo "$name" >"$BASHIBLE_STATE_DIR/discovered-node-name"
    fi
}

bb-d8-machine-name() {
    if [[ -s "$BASHIBLE_STATE_DIR/machine-name" ]]; then
        echo "$(<"$BASHIBLE_STATE_DIR/machine-name")"
    else
        bb-d8-node-name
    fi
}

bb-d8-node-ip() {
    if [[ -s "$BASHIBLE_STATE_DIR/discovered-node-ip" ]]; then
        echo "$(<"$BASHIBLE_STATE_DIR/discovered-node-ip")"
    else
        bb-log-error "the node's IP is not known ($BASHIBLE_STATE_DIR/discovered-node-ip is missing)"
        return 1
    fi
}

# bb-deckhouse-get-disruptive-update-approval: call before a disruptive action. Returns at once
# on the node's first run or when the disruption flag is set; otherwise the agent annotates the
# Node update.node.deckhouse.io/disruption-required and waits for disruption-approved, then the
# flag `disruption` is set. In the RollingUpdate mode the agent asks for the node to be replaced
# instead (exit 10) and the step ends successfully here, as in Deckhouse.
bb-deckhouse-get-disruptive-update-approval() {
    if [[ "${FIRST_BASHIBLE_RUN:-no}" == yes ]]; then
        return 0
    fi
    if _bb_flag_p disruption; then
        return 0
    fi
    _bb_agent || exit 1
    bb-log-info "Disruption required, asking for approval"
    local rc=0
    "${BB_AGENT_ARGV[@]}" internal-disruption || rc=$?
    case "$rc" in
        0)
            bb-log-info "Disruption approved!"
            bb-flag-set disruption
            ;;
        10)
            bb-log-info "The node will be replaced (RollingUpdate); nothing more to do in this step."
            exit 0
            ;;
        *)
            bb-log-error "ERROR: disruption approval failed (agent exit code $rc)"
            exit "$rc"
            ;;
    esac
}

# bb-run-finished: for the agent, after the last step of a successful converge. Forgets the
# changes whose handlers have run and the package-index flags, as Deckhouse's cleanup step does.
bb-run-finished() {
    rm -f "$BB_SYNC_UNHANDLED_FILES_STORE" "$BB_APT_UNHANDLED_PACKAGES_STORE" "$BB_YUM_UNHANDLED_PACKAGES_STORE" \
        "$BB_DNF_UNHANDLED_PACKAGES_STORE" "$BB_ZYPPER_UNHANDLED_PACKAGES_STORE"
    local flag
    for flag in apt-updated apt-rpm-updated yum-updated dnf-updated zypper-updated; do bb-flag-unset "$flag"; done
}

# ---- the public `?` names ---------------------------------------------------------------------
# Deckhouse's predicates end in `?`, a glob character: inside this file they are called by their
# internal names, so a step's `shopt -s nullglob` or a matching file name cannot change a call.
bb-apt?() { _bb_apt_p "$@"; }
bb-apt-hold?() { _bb_apt_hold_p "$@"; }
bb-apt-package?() { _bb_apt_package_p "$@"; }
bb-apt-package-upgrade?() { _bb_apt_package_upgrade_p "$@"; }
bb-apt-repo?() { _bb_apt_repo_p "$@"; }
bb-apt-rpm?() { _bb_apt_rpm_p "$@"; }
bb-apt-rpm-package?() { _bb_apt_rpm_package_p "$@"; }
bb-dnf?() { _bb_dnf_p "$@"; }
bb-dnf-package?() { _bb_dnf_package_p "$@"; }
bb-dnf-repo?() { _bb_dnf_repo_p "$@"; }
bb-exe?() { _bb_exe_p "$@"; }
bb-flag?() { _bb_flag_p "$@"; }
bb-is-astra-version?() { _bb_is_astra_version_p "$@"; }
bb-is-centos-version?() { _bb_is_centos_version_p "$@"; }
bb-is-debian-version?() { _bb_is_debian_version_p "$@"; }
bb-is-ubuntu-version?() { _bb_is_ubuntu_version_p "$@"; }
bb-yum?() { _bb_yum_p "$@"; }
bb-yum-package?() { _bb_yum_package_p "$@"; }
bb-yum-repo?() { _bb_yum_repo_p "$@"; }
bb-zypper?() { _bb_zypper_p "$@"; }
bb-zypper-package?() { _bb_zypper_package_p "$@"; }
bb-rp-is-installed?() { if [[ -n "${2:-}" ]]; then _bb_package_installed_p "$(_bb_rp_ref "$1:$2")"; else _bb_package_installed_p "$1"; fi; }
bb-apt-rpm-repo?() { _bb_apt_repo_p "$@"; }
bb-apt-rpm-package-upgrade?() { _bb_apt_rpm_package_upgrade_p "$@"; }
bb-package-is-installed?() { _bb_package_installed_p "$1"; }
bb-is-distro-like?() { _bb_is_distro_like_p "$@"; }

# ---- set-up and the EXIT trap -----------------------------------------------------------------

# Runs when the step ends, however it ends: the bb-cleanup event and the delayed events first
# (a failing handler fails a step that had succeeded), then the temporary files; exits with the
# step's status.
bb-cleanup() {
    local rc=$? opts=$- handlers_rc
    if ((BB_EXIT_CODE != 0)); then rc=$BB_EXIT_CODE; fi
    # Handlers run with the step's errexit (a failing command stops them, as in the step), in a
    # subshell so that their failure still lets the clean-up below run.
    set +e
    (
        [[ "$opts" == *e* ]] && set -e
        bb-event-fire bb-cleanup
        bb-event-cleanup
    )
    handlers_rc=$?
    if ((rc == 0 && handlers_rc != 0)); then rc=$handlers_rc; fi
    bb-flag-cleanup
    bb-tmp-cleanup 2>/dev/null || true
    bb-workspace-cleanup
    trap - EXIT
    exit "$rc"
}

bb-workspace-init
bb-tmp-init
bb-event-init
bb-flag-init
trap bb-cleanup EXIT
