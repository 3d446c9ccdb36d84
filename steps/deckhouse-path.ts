// DeckhousePath (004_add_deckhouse_paths): /opt/deckhouse/bin exists and login shells find it
// first on PATH, exactly once, through a profile drop-in (ALT Linux reads both /etc/profile.d
// and /etc/bashrc.d). As in Deckhouse the directory is prepended, so the binaries registry
// packages install win over the distribution's, and the drop-in is executable.
import { PATHS, PROFILE_DROP_INS } from "../bundles/paths.ts";
import { planDir, planFile } from "../host/file-plan.ts";
import type { Primitive, Step } from "./types.ts";

const BIN_DIR = PATHS.binDir;

// POSIX sh: sourced by sh, bash, dash and zsh alike. The case guard keeps PATH free of
// duplicates however many times the file is read (nested shells, su -, sudo -i).
export const PROFILE_CONTENT = `# Managed by bashible (004_add_deckhouse_paths): puts ${BIN_DIR} first on PATH, once.
case ":\${PATH}:" in
  *:${BIN_DIR}:*) ;;
  *) export PATH="${BIN_DIR}\${PATH:+:\${PATH}}" ;;
esac
`;

const step: Step<"DeckhousePath"> = {
  kind: "DeckhousePath",
  async plan(_spec, host) {
    const changes: Primitive[] = [];
    for (const dir of ["/opt/deckhouse", BIN_DIR]) {
      const c = await planDir(host, dir, { mode: 0o755 });
      if (c) changes.push(c);
    }
    for (const file of PROFILE_DROP_INS[host.os.family]) {
      const c = await planFile(host, { path: file, content: PROFILE_CONTENT, mode: 0o755 });
      if (c) changes.push(c);
    }
    return { changes, problems: [] };
  },
};

export default step;
