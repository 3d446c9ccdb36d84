import pkg from "../package.json" with { type: "json" };

// A release build may stamp its own version (scripts/build.ts `--version`: esbuild defines this
// name); a build without it, and the sources run as they are, say package.json's.
declare const __BASHIBLE_VERSION__: string | undefined;

export const VERSION: string = typeof __BASHIBLE_VERSION__ === "string" ? __BASHIBLE_VERSION__ : pkg.version;
