// containerd's TOML: parsed with types kept, written back so it parses to the same thing, and
// fragments merged as Deckhouse's toml-merge merges them (Talos's merge over decoded maps).
import t from "tap";
import { mergeToml, parseToml, stringifyToml, TomlDateTime, TomlError } from "../../steps/lib/toml.ts";

const plain = (v: unknown) =>
  JSON.parse(
    JSON.stringify(v, (_k, x) =>
      typeof x === "bigint" ? `int:${x}` : x instanceof TomlDateTime ? `date:${x.raw}` : x,
    ),
  );

t.test("TOML 1.0 as containerd configurations and fragments write it", async (t) => {
  const doc = parseToml(
    [
      "version = 2",
      'root = "/var/lib/containerd" # a comment',
      "[plugins]",
      '  [plugins."io.containerd.gc.v1.scheduler"]',
      "    pause_threshold = 0.02",
      "    deletion_threshold = 0",
      "  [plugins.'io.containerd.grpc.v1.cri'.cni]",
      "    bin_dirs = ['/opt/cni/bin',",
      '      "/usr/lib/cni", # trailing comma next',
      "    ]",
      "    hex = 0xff",
      "    big = 1_000_000",
      "    when = 1979-05-27T07:32:00Z",
      '    inline = { a = 1, "b c" = true }',
      '    multi = """',
      "one\\",
      '   two"""',
      "[[x]]",
      "n = 1",
      "[[x]]",
      "n = 2",
    ].join("\n"),
  );
  t.same(plain(doc), {
    version: "int:2",
    root: "/var/lib/containerd",
    plugins: {
      "io.containerd.gc.v1.scheduler": { pause_threshold: 0.02, deletion_threshold: "int:0" },
      "io.containerd.grpc.v1.cri": {
        cni: {
          bin_dirs: ["/opt/cni/bin", "/usr/lib/cni"],
          hex: "int:255",
          big: "int:1000000",
          when: "date:1979-05-27T07:32:00Z",
          inline: { a: "int:1", "b c": true },
          multi: "onetwo",
        },
      },
    },
    x: [{ n: "int:1" }, { n: "int:2" }],
  });
  const text = stringifyToml(doc);
  t.same(plain(parseToml(text)), plain(doc), "what it writes parses back to the same values and types");
  t.match(text, /^ {4}pause_threshold = 0\.02$/m, "a float stays a float");
  t.match(text, /^ {4}deletion_threshold = 0$/m, "an integer stays an integer");
  t.match(text, /^ {4}\[plugins\."io\.containerd\.grpc\.v1\.cri"\.cni\]$/m, "quoted keys, indented tables");
  t.equal(plain(parseToml("a = 1.0")).a, 1, "1.0 is a float");
  t.match(stringifyToml(parseToml("a = 1.0")), /^a = 1\.0$/m, "and is written as one");
});

t.test("what is not TOML is refused with the file and the line", async (t) => {
  for (const [text, why] of [
    ["a = 1\na = 2", /line 2: key a is defined twice/],
    ["[a]\n[a]", /line 2: \[a\] is defined twice/],
    ['a = "unterminated', /line 1: a string that does not end/],
    ["a = [1, 2", /expected , or \]/],
    ["a = nope", /"nope" is not a TOML value/],
    ["a = {b = 1}\n[a.c]", /inline table/],
  ] as const) {
    t.throws(() => parseToml(text, "/etc/containerd/conf.d/x.toml"), { name: "TomlError", message: why }, text);
  }
  t.throws(() => parseToml("a = 1\nb", "f.toml"), /^f\.toml: line 2: expected = after the key b/);
});

t.test("a fragment merges as Deckhouse's toml-merge merges it", async (t) => {
  const base = parseToml(
    [
      '[plugins."io.containerd.grpc.v1.cri"]',
      '  sandbox_image = "pause:3.10"',
      "  max_concurrent_downloads = 3",
      "  enable_selinux = true",
      '  [plugins."io.containerd.grpc.v1.cri".cni]',
      '    bin_dirs = ["/opt/cni/bin"]',
    ].join("\n"),
  );
  mergeToml(
    base,
    parseToml(
      [
        '[plugins."io.containerd.grpc.v1.cri"]',
        "  max_concurrent_downloads = 7",
        "  enable_selinux = false",
        '  sandbox_image = ""',
        '  [plugins."io.containerd.grpc.v1.cri".cni]',
        '    bin_dirs = ["/usr/lib/cni"]',
        '  [plugins."io.containerd.grpc.v1.cri".registry.configs."r.example".auth]',
        '    auth = "dXNlcjpwYXNz"',
      ].join("\n"),
    ),
  );
  t.same(plain(base), {
    plugins: {
      "io.containerd.grpc.v1.cri": {
        sandbox_image: "pause:3.10",
        max_concurrent_downloads: "int:7",
        enable_selinux: false,
        cni: { bin_dirs: ["/opt/cni/bin", "/usr/lib/cni"] },
        registry: { configs: { "r.example": { auth: { auth: "dXNlcjpwYXNz" } } } },
      },
    },
  });
  t.pass("a table is merged key by key, not replaced; a value replaces one (false too)");
  t.pass("arrays are concatenated; an empty string (or a zero) leaves the base's value");
  t.throws(() => mergeToml(parseToml("a = 1"), parseToml('a = "1"')), {
    name: "TomlError",
    message: "a is an integer in the configuration and a string in the fragment",
  });
  t.ok(new TomlError("x").permanent, "a refusal waiting cannot fix");
});
