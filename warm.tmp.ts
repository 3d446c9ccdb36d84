import { debianRoot } from "./scripts/lib/debian-root.ts";
import { localDebianRepo } from "./scripts/lib/debian-mirror.ts";
import { E2E_MIRROR_PACKAGES, E2E_NODE_PACKAGES } from "./scripts/lib/e2e/world.ts";
const t0 = Date.now();
const [root, a, b] = await Promise.all([
  debianRoot({ packages: E2E_NODE_PACKAGES, log: console.log }),
  localDebianRepo({ packages: E2E_MIRROR_PACKAGES, log: console.log }),
  localDebianRepo({ packages: [...E2E_MIRROR_PACKAGES, "rsyslog"], log: console.log }).catch((e) => { console.log("b", e.message); return undefined; }),
]);
console.log(root.dir, root.buildSeconds, a.packages.length, a.seconds, b?.packages.length, (Date.now() - t0) / 1000);
