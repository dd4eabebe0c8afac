// A minimal LSP client for tests/schema.rs: drives yaml-language-server over stdio as an editor
// would, and prints what an editor would show, as JSON.
//
// Usage: node lsp.js SERVER_JS WORKSPACE_DIR REQUEST_JSON_FILE
//   REQUEST_JSON_FILE: {"settings": {...yaml settings...},
//                       "files": {"relative/path.yaml": "text", ...},
//                       "queries": [{"kind": "completion"|"hover", "file": "...", "line": 0, "character": 0}]}
// Prints {"diagnostics": {"relative/path.yaml": [{"line": 1, "message": "..."}]},
//         "answers": [[labels...] | "hover markdown" | null]}. Exits by itself after 60 s.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');

const [serverJs, workspace, requestFile] = process.argv.slice(2);
const request = JSON.parse(fs.readFileSync(requestFile, 'utf8'));
const root = path.resolve(workspace);
const uriOf = (file) => 'file://' + path.join(root, file);
setTimeout(() => { console.error('lsp.js: timed out'); process.exit(3); }, 60000).unref();

const server = spawn(process.execPath, [serverJs, '--stdio'], { stdio: ['pipe', 'pipe', 'inherit'] });
let buffer = Buffer.alloc(0);
let nextId = 0;
const pending = new Map();
const diagnostics = new Map();

function send(message) {
  const text = JSON.stringify(Object.assign({ jsonrpc: '2.0' }, message));
  server.stdin.write(`Content-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`);
}
function call(method, params) {
  return new Promise((resolve) => { pending.set(++nextId, resolve); send({ id: nextId, method, params }); });
}

server.stdout.on('data', (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  for (;;) {
    const end = buffer.indexOf('\r\n\r\n');
    if (end < 0) return;
    const length = Number(/Content-Length: (\d+)/i.exec(buffer.subarray(0, end).toString())[1]);
    if (buffer.length < end + 4 + length) return;
    const message = JSON.parse(buffer.subarray(end + 4, end + 4 + length).toString());
    buffer = buffer.subarray(end + 4 + length);
    if (message.method === 'textDocument/publishDiagnostics') {
      diagnostics.set(message.params.uri, message.params.diagnostics);
    } else if (message.method !== undefined && message.id !== undefined) {
      // A request from the server: the settings are the only one that needs an answer.
      const result = message.method === 'workspace/configuration'
        ? message.params.items.map(() => request.settings) : null;
      send({ id: message.id, result });
    } else if (pending.has(message.id)) {
      pending.get(message.id)(message.result);
      pending.delete(message.id);
    }
  }
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

(async () => {
  await call('initialize', {
    processId: process.pid,
    rootUri: 'file://' + root,
    capabilities: { workspace: { configuration: true }, textDocument: { completion: {}, hover: {} } },
  });
  send({ method: 'initialized', params: {} });
  send({ method: 'workspace/didChangeConfiguration', params: { settings: { yaml: request.settings } } });
  const files = Object.keys(request.files);
  for (const file of files) {
    send({ method: 'textDocument/didOpen',
           params: { textDocument: { uri: uriOf(file), languageId: 'yaml', version: 1, text: request.files[file] } } });
  }
  // Diagnostics arrive asynchronously; wait until every file has them, then a little longer
  // in case a file is validated again once its schema has loaded.
  for (let i = 0; i < 100 && files.some((f) => !diagnostics.has(uriOf(f))); i++) await sleep(200);
  await sleep(1500);
  const answers = [];
  for (const q of request.queries || []) {
    const params = { textDocument: { uri: uriOf(q.file) }, position: { line: q.line, character: q.character } };
    if (q.kind === 'hover') {
      const hover = await call('textDocument/hover', params);
      answers.push(hover ? (hover.contents.value || JSON.stringify(hover.contents)) : null);
    } else {
      const completion = await call('textDocument/completion', params);
      answers.push(((completion && (completion.items || completion)) || []).map((item) => item.label));
    }
  }
  const out = { diagnostics: {}, answers };
  for (const file of files) {
    out.diagnostics[file] = (diagnostics.get(uriOf(file)) || [])
      .map((d) => ({ line: d.range.start.line + 1, message: d.message }));
  }
  process.stdout.write(JSON.stringify(out));
  await call('shutdown', null);
  send({ method: 'exit' });
  server.kill();
  process.exit(0);
})();
