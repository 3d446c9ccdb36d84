// FilePermissions (098_set_permissions): the CIS Kubernetes Benchmark's modes for the node's
// Kubernetes files, as Deckhouse's 098_set_permissions tightens them. A path no built-in step
// writes (kubelet.conf and the kubelet's pki directory, which the kubelet makes) is set here; a
// path another built-in step writes (the kubelet's config.yaml, say) keeps that step's mode,
// because two steps setting one file's mode differently would change it back and forth on
// every run: a looser mode there is reported as a problem naming the step that owns the file.
// Modes are only ever tightened: a stricter mode is left as it is.
//
// Left out of Deckhouse's list on purpose: /etc/kubernetes 0700 (the API proxy's nginx runs as a
// dynamic user and reads /etc/kubernetes/kubernetes-api-proxy/nginx.conf) and etcd's files (no
// control plane on these nodes).
import { filePermissions } from "../bundles/steps/after-bootstrap.ts";
import type { Primitive, Problem, Step } from "./types.ts";

const octal = (m: number) => `0${m.toString(8)}`;

const step: Step<"FilePermissions"> = {
  kind: "FilePermissions",
  async plan(_spec, host, ctx) {
    const changes: Primitive[] = [];
    const problems: Problem[] = [];
    const inBundle = new Set(ctx.bundle.steps.map((s) => s.name));
    for (const want of filePermissions.modes) {
      const st = await host.stat(want.path);
      if (!st || st.isSymlink) continue;
      const extra = st.mode & ~want.mode & 0o777;
      if (!extra) continue;
      const tightened = st.mode & want.mode;
      const owner = "owner" in want ? want.owner : undefined;
      if (owner && inBundle.has(owner)) {
        problems.push({
          subject: want.path,
          message: `mode ${octal(st.mode)} is looser than CIS ${want.cis} asks (${octal(want.mode)}); ${owner} writes this file and sets its mode`,
        });
        continue;
      }
      if (st.isDirectory) {
        changes.push({
          kind: "dir",
          path: want.path,
          action: "update",
          mode: tightened,
          uid: st.uid,
          gid: st.gid,
          summary: `set ${want.path} to ${octal(tightened)} (was ${octal(st.mode)}; CIS ${want.cis})`,
        });
      } else {
        changes.push({
          kind: "command",
          argv: ["chmod", octal(tightened), host.path(want.path)],
          summary: `set ${want.path} to ${octal(tightened)} (was ${octal(st.mode)}; CIS ${want.cis})`,
        });
      }
    }
    return { changes, problems };
  },
};

export default step;
