// stop_token_ids through kvfleet-router and a mock worker. The worker's model has a
// 128-token vocabulary, so with the router's byte codec each generated token is one ASCII
// character of the answer: a first request reads which token comes at step k, and the
// same request with stop_token_ids=[that token] must end there with finish_reason "stop".
//   node stop_tokens_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);

const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir, { recursive: true });
fs.writeFileSync(path.join(modelDir, 'config.json'), JSON.stringify({
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 128, hidden_size: 64,
  intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
  max_position_embeddings: 2048, eos_token_id: 127 }));
fs.writeFileSync(path.join(modelDir, 'generation_config.json'), JSON.stringify({ eos_token_id: [127, 126] }));

const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 1,
                          workerArgs: ['--model-dir', modelDir] });

async function post(route, body) {
  const r = await fetch(`${fleet.url()}/v1/${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', ...body }) });
  return { status: r.status, body: await r.json() };
}
const textOf = (route, b) => (route === 'completions' ? b.choices[0].text : b.choices[0].message.content);

// Probes the answer, then stops it at the first token that does not occur before it.
async function stopsAt(route, request) {
  const probe = await post(route, { ...request, max_tokens: 8, temperature: 0, seed: 7 });
  const text = textOf(route, probe.body);
  check(probe.status === 200 && text.length === 8 && probe.body.choices[0].finish_reason === 'length',
        `${route}: the probe runs to max_tokens (${JSON.stringify(text)})`);
  let k = 2;
  while (text.slice(0, k).includes(text[k])) k++;
  const stopId = text.charCodeAt(k);
  const stopped = await post(route, { ...request, max_tokens: 8, temperature: 0, seed: 7, stop_token_ids: [stopId] });
  const got = textOf(route, stopped.body);
  check(stopped.status === 200 && stopped.body.choices[0].finish_reason === 'stop',
        `${route}: stop_token_ids=[${stopId}] ends the answer with finish_reason "stop"`);
  check(stopped.body.usage.completion_tokens === k + 1 && got.startsWith(text.slice(0, k)),
        `${route}: it ends at step ${k + 1}, the stop token's (${JSON.stringify(got)})`);
}

await runAgainst(fleet, async () => {
  await stopsAt('completions', { prompt: [1, 2, 3, 4, 5, 6, 7, 8] });
  await stopsAt('chat/completions', { messages: [{ role: 'user', content: 'Hello' }] });
  const bad = await post('completions', { prompt: 'x', stop_token_ids: [-1] });
  check(bad.status === 400 && bad.body.error.param === 'stop_token_ids', 'a negative id: 400 naming stop_token_ids');
  const outside = await post('completions', { prompt: 'x', stop_token_ids: [128] });
  check(outside.status === 400, `an id outside the vocabulary: 400 (${JSON.stringify(outside.body)})`);
});
