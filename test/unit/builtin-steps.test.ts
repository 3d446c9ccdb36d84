// The built-in steps' descriptors (bundles/steps/) are the one list of them: what derives from
// them stays whole. Each descriptor's step is in a full render under its name with a spec its
// schema accepts, each kind has a step module, and cleanup stops every unit a step manages.
import t from "tap";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderGroup } from "../../cluster/render/render.ts";
import type { RenderInputs } from "../../cluster/render/inputs.ts";
import { BUILTIN_LIST, BUILTIN_STEPS, CLEANUP_UNITS, UNITS } from "../../bundles/steps/index.ts";
import { DECKHOUSE_ONLY_UNITS } from "../../bundles/deckhouse-node.ts";
import { STEP_KINDS, STEP_SPECS } from "../../bundles/specs.ts";
import { STEP_NAME } from "../../bundles/rules.ts";
import { STEPS } from "../../steps/index.ts";

const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const inputs = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
const rendered = renderGroup(inputs.nodeGroups[0]!, inputs, Date.parse("2026-01-01T00:00:00Z"));

t.test("every built-in step renders under its descriptor's name with a spec its schema accepts", async (t) => {
  t.equal(new Set(BUILTIN_LIST.map((d) => d.name)).size, BUILTIN_LIST.length, "names are unique");
  t.same(Object.values(BUILTIN_STEPS).sort(), BUILTIN_LIST.map((d) => d.name).sort());
  for (const d of BUILTIN_LIST) {
    t.match(d.name, STEP_NAME, `${d.name} is NNN_name`);
    const step = rendered.bundle.steps.find((s) => s.name === d.name);
    t.equal(step?.kind, d.kind, `${d.name} is in the example's bundle as ${d.kind}`);
    t.doesNotThrow(() => d.spec.parse(step?.spec, d.name), `${d.name}'s spec matches its schema`);
    t.equal(STEP_SPECS[d.kind], d.spec, `${d.kind}'s schema is the bundle's`);
  }
});

t.test("every step kind has a module that runs it", async (t) => {
  for (const kind of STEP_KINDS) t.equal((await STEPS[kind]()).default.kind, kind);
});

t.test("cleanup stops and removes every unit a built-in step manages, the agent first", async (t) => {
  const script = (rendered.bashible.data as Record<string, string>)["cleanup_static_node.sh"]!;
  const listed = script.match(/^UNITS=\(([^)]*)\)$/m)?.[1]?.split(" ");
  // Then the units only Deckhouse's own bashible runs (a node adopted from it).
  t.same(listed, [...CLEANUP_UNITS, ...DECKHOUSE_ONLY_UNITS]);
  for (const unit of Object.values(UNITS)) t.ok(listed?.includes(unit), `${unit} is cleaned up`);
  t.equal(listed?.[0], UNITS.agent, "the agent stops before what it would restart");
});
