// 032_configure_containerd: containerd's configuration, registries and unit.
import { arr, type Infer, int, obj, oneOf, opt, str } from "../schema.ts";
import { PACKAGE_NAME } from "../rules.ts";
import { pemCertificate } from "./ca-certificates.ts";
import { builtinStep } from "./descriptor.ts";

const UNIT = "containerd-deckhouse.service";

/** containerd's and the kubelet's: the two must agree. */
export const CGROUP_DRIVER = oneOf(["systemd", "cgroupfs"] as const);

/** An image reference: name[:tag][@digest], no whitespace or quotes (it lands in TOML). */
const IMAGE_REF = /^[a-z0-9][a-z0-9._:/-]*(@sha256:[0-9a-f]{64})?$/;
const REGISTRY_HOST = /^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$/;
const MIRROR_URL = /^https?:\/\/[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(\/[A-Za-z0-9._/-]*)?$/;

export const CONTAINERD_REGISTRY = obj({
  /** host[:port], as images name it; becomes a directory under /etc/containerd/registry.d. */
  host: str({ max: 253, pattern: REGISTRY_HOST, what: "a registry host[:port]" }),
  scheme: oneOf(["https", "http"] as const),
  /** PEM the registry's certificate is verified with (besides the system's trust store). */
  ca: opt(pemCertificate("registry CA")),
  /** base64 of `user:password` (a docker config's `auth`); a secret. */
  auth: opt(str({ max: 4096, pattern: /^[A-Za-z0-9+/]+=*$/, what: "base64 of user:password" })),
  /** Mirrors tried before the registry itself, in order. */
  mirrors: arr(str({ max: 512, pattern: MIRROR_URL, what: "a mirror URL (http[s]://host[:port][/path])" }), {
    max: 16,
  }),
});
export type ContainerdRegistry = Infer<typeof CONTAINERD_REGISTRY>;

/** http(s)://[user[:password]@]host[:port][/]: what HTTP_PROXY takes. */
const PROXY_URL = /^https?:\/\/([^\s@/"'\\]+@)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?\/?$/;
/** A NO_PROXY entry: a host, a domain (.example.com), an address or a CIDR. */
const NO_PROXY_ENTRY = /^[A-Za-z0-9.*:/_-]{1,253}$/;

/** The cluster's proxy as containerd's environment gets it (Deckhouse's 002_add_system_proxy). */
export const CONTAINERD_PROXY = obj({
  httpProxy: opt(str({ max: 1024, pattern: PROXY_URL, what: "a proxy URL (http://host:port)" })),
  httpsProxy: opt(str({ max: 1024, pattern: PROXY_URL, what: "a proxy URL (http://host:port)" })),
  noProxy: arr(str({ pattern: NO_PROXY_ENTRY, what: "a host, domain, address or CIDR" }), { max: 256 }),
});
export type ContainerdProxy = Infer<typeof CONTAINERD_PROXY>;

export const containerd = builtinStep({
  name: "032_configure_containerd",
  kind: "Containerd",
  spec: obj({
    cgroupDriver: CGROUP_DRIVER,
    sandboxImage: str({ max: 512, pattern: IMAGE_REF, what: "an image reference" }),
    snapshotter: str({ pattern: /^[a-z0-9_-]{1,32}$/, what: "a snapshotter name" }),
    maxConcurrentDownloads: int({ min: 1, max: 64 }),
    registries: arr(CONTAINERD_REGISTRY, { max: 32, unique: (r) => r.host }),
    /** The cluster's HTTP(S) proxy for pulls; absent: none (a drop-in an earlier proxy left is removed). */
    proxy: opt(CONTAINERD_PROXY),
    /** The registry package that installs containerd: its digest names the binary (a new one restarts it). */
    package: str({ pattern: PACKAGE_NAME, what: "a package name" }),
  }),
  /** Deckhouse's name: the distribution's own containerd.service is not what this step writes. */
  units: { containerd: UNIT },
  /** The distribution's containerd.service goes too. */
  cleanupUnits: ["containerd.service", UNIT],
});
