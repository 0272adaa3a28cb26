// onnx_run.js: runs an exported .onnx model in onnxruntime (the onnxruntime-node package, CPU).
//
//   node test/onnx_run.js MODEL.onnx                       one gray (0.5) image at the model's size
//   node test/onnx_run.js MODEL.onnx IN.bin B H W OUT.bin  the input from IN.bin (B*3*H*W values in
//                                                          the model's input type, little-endian);
//                                                          output0's raw bytes to OUT.bin
// Prints the input and output names, types and shapes, and the time of the run.
// Install the runtime first: npm install --prefix test/onnx onnxruntime-node --ignore-scripts
'use strict';
const fs = require('fs');
const path = require('path');

let ort;
try {
    ort = require(path.join(__dirname, 'onnx', 'node_modules', 'onnxruntime-node'));
} catch (e) {
    try { ort = require('onnxruntime-node'); } catch (e2) {
        console.error('onnx_run.js: onnxruntime-node is not installed (npm install --prefix test/onnx onnxruntime-node --ignore-scripts)');
        process.exit(2);
    }
}

async function main() {
    const a = process.argv.slice(2);
    if (a.length !== 1 && a.length !== 6) {
        console.error('usage: node test/onnx_run.js MODEL.onnx [IN.bin B H W OUT.bin]');
        process.exit(2);
    }
    const session = await ort.InferenceSession.create(a[0], { intraOpNumThreads: 2, interOpNumThreads: 1 });
    const meta = session.inputMetadata && session.inputMetadata[0];
    const inName = session.inputNames[0], outName = session.outputNames[0];
    // the input type: float16 models (half=1) take float16 input
    const half = meta && meta.type === 'float16';
    let dims, data;
    if (a.length === 6) {
        dims = [Number(a[2]), 3, Number(a[3]), Number(a[4])];
        const buf = fs.readFileSync(a[1]);
        const n = dims.reduce((p, q) => p * q, 1);
        if (buf.length !== n * (half ? 2 : 4)) {
            console.error(`onnx_run.js: ${a[1]} has ${buf.length} bytes, expected ${n} ${half ? 'float16' : 'float32'} values`);
            process.exit(2);
        }
        const copy = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length);
        data = half ? new Uint16Array(copy) : new Float32Array(copy);
    } else {
        // the declared shape; symbolic dimensions (dynamic=1) become 1 x 3 x 640 x 640
        const shape = meta && meta.shape ? meta.shape : [1, 3, 640, 640];
        dims = shape.map((d, i) => (typeof d === 'number' && d > 0 ? d : [1, 3, 640, 640][i]));
        const n = dims.reduce((p, q) => p * q, 1);
        data = half ? new Uint16Array(n).fill(0x3800) : new Float32Array(n).fill(0.5);   // 0x3800 = 0.5 in FP16
    }
    const feeds = {};
    feeds[inName] = new ort.Tensor(half ? 'float16' : 'float32', data, dims);
    const t0 = process.hrtime.bigint();
    const out = (await session.run(feeds))[outName];
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    console.log(`input  ${inName} ${half ? 'float16' : 'float32'} [${dims.join(', ')}]`);
    console.log(`output ${outName} ${out.type} [${out.dims.join(', ')}]  ${ms.toFixed(1)} ms (onnxruntime-node, CPU)`);
    if (a.length === 6) {
        const d = out.data;
        fs.writeFileSync(a[5], Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    }
}
main().catch((e) => { console.error('onnx_run.js: ' + (e && e.message ? e.message : e)); process.exit(1); });
