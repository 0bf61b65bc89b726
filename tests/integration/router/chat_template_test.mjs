// Chat templates through kvfleet-router with --tokenizer and a mock worker: a model without
// a template answers chats with a 500 naming the fix; chat_template.jinja in the model
// directory is found; --chat-template FILE overrides it; an unreadable or unparsable
// --chat-template stops the router at start-up, naming the option.
//   node chat_template_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, byteLevelTokenizer, check } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);

const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir, { recursive: true });
fs.writeFileSync(path.join(modelDir, 'tokenizer.json'), JSON.stringify(byteLevelTokenizer()));
fs.writeFileSync(path.join(modelDir, 'tokenizer_config.json'), '{}');

const chat = (fleet) => fetch(`${fleet.url()}/v1/chat/completions`, {
  method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'mock', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
});

// One router (and one mock worker) per case. The cases run one after another on the same
// ports: this script's range holds one fleet (run.sh's offset leaves it about 230 ports), and
// Fleet.stop() returns only once the previous case's processes have exited.
let fleetCount = 0;
async function withFleet(routerArgs, body) {
  const fleet = new Fleet({ routerBin, workerBin, dir: path.join(dir, `fleet-${fleetCount++}`),
                            basePort: Number(basePort), workers: 1,
                            routerArgs: ['--tokenizer', modelDir, ...routerArgs] });
  try {
    await fleet.start();
    await body(fleet);
  } finally {
    await fleet.stop();
  }
}

// The router's exit status and output when it refuses to start.
function refused(args) {
  const r = spawnSync(routerBin, ['--http-host', '127.0.0.1', '--http-port', '0', '--tokenizer', modelDir, ...args],
                      { encoding: 'utf8', timeout: 20000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

let failed = false;
try {
  const probe = refused(['--chat-template', path.join(dir, 'none.jinja')]);
  if (probe.output.includes('no tokenizer library')) {
    console.log('SKIP: this build has no tokenizer library');
    process.exit(77);
  }
  check(probe.status === 2 && probe.output.includes('--chat-template'),
        `an unreadable --chat-template stops the router, naming the option (${probe.output.trim()})`);
  const bad = path.join(dir, 'bad.jinja');
  fs.writeFileSync(bad, '{% if %}');
  const badRun = refused(['--chat-template', bad]);
  check(badRun.status === 2 && badRun.output.includes('--chat-template'),
        `an unparsable --chat-template stops the router, naming the option (${badRun.output.trim()})`);

  await withFleet([], async (fleet) => {
    const r = await chat(fleet);
    const body = await r.json();
    check(r.status === 500 && body.error?.code === 'chat_template_missing',
          `no chat template: 500 chat_template_missing (${r.status} ${JSON.stringify(body)})`);
    check(body.error.message.includes('--chat-template FILE') && body.error.message.includes('chat_template.jinja'),
          'the message names the fix');
  });

  fs.writeFileSync(path.join(modelDir, 'chat_template.jinja'), 'dir:{{ messages[0].content }}');
  await withFleet([], async (fleet) => {
    const r = await chat(fleet);
    const body = await r.json();
    check(r.status === 200 && body.usage.prompt_tokens === 'dir:hi'.length,
          `the model directory's chat_template.jinja renders the chat (${JSON.stringify(body.usage)})`);
  });

  const override = path.join(dir, 'override.jinja');
  fs.writeFileSync(override, 'override template:{{ messages[0].content }}');
  await withFleet(['--chat-template', override], async (fleet) => {
    const r = await chat(fleet);
    const body = await r.json();
    check(r.status === 200 && body.usage.prompt_tokens === 'override template:hi'.length,
          `--chat-template overrides the directory's template (${JSON.stringify(body.usage)})`);
  });
} catch (e) {
  console.error(e.stack || String(e));
  failed = true;
}
process.exit(failed ? 1 : 0);
