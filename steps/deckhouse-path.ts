// DeckhousePath: /opt/deckhouse/bin exists and login shells find it on PATH, exactly once,
// through a profile drop-in (ALT Linux reads /etc/bashrc.d, the others /etc/profile.d).
import type { BundleFamily } from "../bundles/os-families.ts";
import { applyFileChange, planFile } from "../agent/host/file-plan.ts";
import type { Change, DirChange, Step } from "./types.ts";

export const BIN_DIR = "/opt/deckhouse/bin";

/** Where each family's shells pick up drop-ins. */
export const PROFILE_DROP_IN: Record<BundleFamily, string> = {
  debian: "/etc/profile.d/02-deckhouse-path.sh",
  rhel: "/etc/profile.d/02-deckhouse-path.sh",
  altlinux: "/etc/bashrc.d/02-deckhouse-path.sh",
};

// POSIX sh: sourced by sh, bash, dash and zsh alike. The case guard keeps PATH free of
// duplicates however many times the file is read (nested shells, su -, sudo -i).
export const PROFILE_CONTENT = `# Managed by bashible (DeckhousePath step): puts ${BIN_DIR} on PATH once.
case ":\${PATH}:" in
  *:${BIN_DIR}:*) ;;
  *) export PATH="\${PATH:+\${PATH}:}${BIN_DIR}" ;;
esac
`;

const step: Step<"DeckhousePath"> = {
  kind: "DeckhousePath",
  async plan(_spec, host) {
    const changes: Change[] = [];
    for (const dir of ["/opt/deckhouse", BIN_DIR]) {
      const st = await host.stat(dir);
      if (st?.isDirectory && st.mode === 0o755 && st.uid === 0 && st.gid === 0) continue;
      if (st && !st.isDirectory) throw new Error(`DeckhousePath: ${dir} exists and is not a directory`);
      const c: DirChange = {
        kind: "dir",
        path: dir,
        action: st ? "update" : "create",
        mode: 0o755,
        uid: 0,
        gid: 0,
        summary: st ? `set ${dir} to 0755 root:root` : `create ${dir} (0755)`,
      };
      changes.push(c);
    }
    const file = await planFile(host, { path: PROFILE_DROP_IN[host.os.family], content: PROFILE_CONTENT, mode: 0o644 });
    if (file) changes.push(file);
    return changes;
  },
  async apply(changes, _spec, host) {
    for (const c of changes) {
      if (c.kind === "dir") await host.mkdir(c.path, { mode: c.mode, uid: c.uid ?? 0, gid: c.gid ?? 0 });
      else if (c.kind === "file") await applyFileChange(host, c);
      else throw new Error(`DeckhousePath: unexpected change kind ${c.kind}`);
    }
    return undefined;
  },
};

export default step;
