"""Random checkpoints in Hugging Face layout (safetensors), for tests.

The tensor names and shapes are the model builder's parameters; a stacked
`{e}` parameter is written as one tensor per expert, as checkpoints store
them. Written with the standard library and numpy (no safetensors package).
"""

import json
import os
import struct
import zlib

import numpy as np

from .models.builder import parameter_shapes


def _bf16_bits(array):
    """float32 values' bits rounded to the nearest bfloat16 (ties to even),
    in the upper half of each uint32. (uint32 arithmetic wraps where a
    uint64 sum masked to 32 bits would: the same bits, 30x faster.)"""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF)
    rounded += (bits >> 16) & np.uint32(1)
    return rounded & np.uint32(0xFFFF0000)


def round_to_bf16(array):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    return _bf16_bits(array).view(np.float32).reshape(np.shape(array))


def _bf16_bytes(array):
    return (_bf16_bits(array) >> 16).astype(np.uint16).tobytes()


def save_safetensors(path, tensors, dtype="f32"):
    """tensors: name -> numpy array (float32 or int32)."""
    # "format": "pt" is what transformers expects of a PyTorch checkpoint.
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        array = tensors[name]
        code = "I32" if array.dtype == np.int32 else "BF16" if dtype == "bf16" else "F32"
        size = array.size * (2 if code == "BF16" else 4)
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    # Through a temporary file beside it, synced and renamed over it: an old
    # checkpoint stays whole until the new one is.
    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        # Tensor by tensor, straight from the arrays (no copy of the whole
        # checkpoint in memory).
        for name in sorted(tensors):
            array = tensors[name]
            if header[name]["dtype"] == "I32":
                np.ascontiguousarray(array).tofile(f)
            elif header[name]["dtype"] == "BF16":
                flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
                for start in range(0, flat.size, 1 << 22):  # bounded temporaries
                    f.write(_bf16_bytes(flat[start:start + (1 << 22)]))
            else:
                np.ascontiguousarray(array, dtype=np.float32).tofile(f)
    _write_atomically(path, write)


def _write_atomically(path, write):
    """`write(f)` into a temporary file beside `path`, synced and renamed
    over it: an old file stays whole until the new one is."""
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _digest(path):
    """A file's size and CRC-32 (zlib's), as an index records them
    (metadata.parax_files) for a loader to check."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def _write_index(path, index, folder, files):
    """An index, written last and atomically, recording each of `files`'
    (in `folder`) size and checksum."""
    index.setdefault("metadata", {})["parax_files"] = {
        file: _digest(os.path.join(folder, file)) for file in sorted(files)}
    _write_atomically(path, lambda f: f.write(json.dumps(index, indent=2).encode()))


def load_safetensors(path):
    """name -> float32 / int32 numpy array."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "F32":
            array = np.frombuffer(raw, dtype=np.float32)
        elif info["dtype"] == "BF16":
            array = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "I32":
            array = np.frombuffer(raw, dtype=np.int32)
        else:
            raise ValueError(f"{path}: dtype {info['dtype']} not supported here")
        out[name] = array.reshape(info["shape"]).copy()
    return out


INDEX = "model.safetensors.index.json"


def save_sharded(folder, tensors, shards, dtype="f32"):
    """A sharded checkpoint as Hugging Face writes one: the tensors dealt
    over `shards` files model-0000k-of-0000n.safetensors in `folder`, and
    the index (weight_map: tensor name -> its file)."""
    import os
    os.makedirs(folder, exist_ok=True)
    names = sorted(tensors)
    weight_map, total = {}, 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[k::shards]}
        save_safetensors(os.path.join(folder, file), part, dtype=dtype)
        weight_map.update({name: file for name in part})
        total += sum(a.size * (2 if dtype == "bf16" and a.dtype != np.int32 else 4) for a in part.values())
    _write_index(os.path.join(folder, INDEX), {"metadata": {"total_size": total}, "weight_map": weight_map},
                 folder, set(weight_map.values()))


BOX_INDEX = "boxes.index.json"


def _box_key(name, start, run=None):
    return name + "@" + ",".join(map(str, start)) + (f"#{run[0]}" if run else "")


def save_boxes(folder, boxes, files):
    """A box-wise checkpoint as parax-run --save-format boxes writes one:
    `boxes` maps a tensor name to (its whole array, [(start, size, file
    number[, (begin, end)])]); a box, or the run [begin, end) of its
    elements in row-major order (a ZeRO chunk), of file f is stored as
    "<name>@<start>[#<begin>]" in boxes-0000f-of-0000n.safetensors (n =
    `files`), and boxes.index.json lists every tensor's shape and boxes."""
    import os
    os.makedirs(folder, exist_ok=True)
    parts, index = [{} for _ in range(files)], {}
    name_of = lambda f: f"boxes-{f + 1:05d}-of-{files:05d}.safetensors"
    for name, (whole, listed) in boxes.items():
        entry = index[name] = {"shape": list(whole.shape), "boxes": []}
        for start, size, f, *run in listed:
            run = run[0] if run else None
            region = tuple(slice(a, a + n) for a, n in zip(start, size))
            data = np.ascontiguousarray(whole[region])
            parts[f][_box_key(name, start, run)] = data.reshape(-1)[run[0]:run[1]].copy() if run else data
            entry["boxes"].append({"start": list(start), "size": list(size), "file": name_of(f),
                                   **({"range": list(run)} if run else {})})
    written = [name_of(f) for f, part in enumerate(parts) if part]
    for f, part in enumerate(parts):
        if part:
            save_safetensors(os.path.join(folder, name_of(f)), part)
    _write_index(os.path.join(folder, BOX_INDEX), {"format": "parax-boxes", "tensors": index}, folder, written)


def _shard_path(folder, file, index, what):
    """The path of a file an index names, which must be a plain file name
    in the index's folder (no directory part, no `..`, not absolute) and no
    symbolic link (which could lead anywhere), as parax-run requires."""
    if not isinstance(file, str) or not file or "/" in file or "\\" in file or file in (".", ".."):
        raise ValueError(f"{index}: {what} is in {file!r}, which is not a plain file name in the "
                         f"index's folder")
    full = os.path.join(folder, file)
    if os.path.islink(full):
        raise ValueError(f"{index}: {what} is in {file!r}, a symbolic link (refused: it may lead "
                         f"outside the checkpoint's folder)")
    return full


def _check_file(path, index, where, file):
    """parax-run names each save in every file it writes and in the index
    (metadata.parax_save): a file of another save is refused (a save that
    died part way, files of two runs together). An index that records its
    files' sizes and checksums (metadata.parax_files) has each checked: a
    file damaged, truncated or replaced since it was saved is refused."""
    metadata = index.get("metadata") or {}
    save = metadata.get("parax_save")
    if save:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            mine = (json.loads(f.read(size)).get("__metadata__") or {}).get("parax_save")
        if mine != save:
            raise ValueError(f"{path}: written by another save ({mine or 'none named'}) than its index names "
                             f"({save}): a save that did not finish, or files of two saves mixed; refused")
    files = metadata.get("parax_files")
    if files is None:
        return
    if file not in files and os.path.exists(path):  # (a missing one: the reader says so)
        raise ValueError(f"{where}: records no size and checksum for its file {file} (an index edited by hand?)")
    if file not in files:
        return
    recorded, found = files[file], _digest(path)
    if found["bytes"] != recorded.get("bytes"):
        raise ValueError(f"{path}: {found['bytes']} bytes, its index records {recorded.get('bytes')} "
                         f"(truncated or replaced since it was saved); refused")
    if found["crc32"] != recorded.get("crc32"):
        raise ValueError(f"{path}: CRC-32 {found['crc32']}, its index records {recorded.get('crc32')} "
                         f"(damaged since it was saved); refused")


def load_boxes(path):
    """name -> whole array from a box-wise checkpoint (its index or
    folder): each tensor put together from its boxes and runs, which must
    tile it (each element written once)."""
    import os
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    with open(os.path.join(folder, BOX_INDEX) if os.path.isdir(path) else path) as f:
        index = json.load(f)
    tensors = index["tensors"]
    files, out = {}, {}
    for name, entry in tensors.items():
        whole = np.zeros(entry["shape"], dtype=np.float32)
        written = np.zeros(entry["shape"], dtype=np.int32)
        for box in entry["boxes"]:
            if box["file"] not in files:
                file = _shard_path(folder, box["file"], path, f"a box of tensor '{name}'")
                _check_file(file, index, path, box["file"])
                files[box["file"]] = load_safetensors(file)
            run = box.get("range")
            data = files[box["file"]][_box_key(name, box["start"], run)]
            region = tuple(slice(a, a + n) for a, n in zip(box["start"], box["size"]))
            begin, end = run or (0, int(np.prod(box["size"])))
            values, counts = whole[region].reshape(-1), written[region].reshape(-1)
            values[begin:end] = data.reshape(-1)
            counts[begin:end] += 1
            whole[region] = values.reshape(box["size"])
            written[region] = counts.reshape(box["size"])
        if not (written == 1).all():
            raise ValueError(f"{path}: the boxes of tensor '{name}' do not tile it")
        out[name] = whole
    return out


def load_checkpoint(path):
    """name -> array from a .safetensors file, a sharded checkpoint's index,
    a box-wise checkpoint's, or a folder holding either (or a lone
    model.safetensors)."""
    import os
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, BOX_INDEX)):
            return load_boxes(path)
        index = os.path.join(path, INDEX)
        path = index if os.path.exists(index) else os.path.join(path, "model.safetensors")
    if not path.endswith(".json"):
        return load_safetensors(path)
    with open(path) as f:
        index = json.load(f)
    if "tensors" in index:
        return load_boxes(path)
    weight_map = index["weight_map"]
    folder, out = os.path.dirname(path), {}
    for file in sorted(set(weight_map.values())):
        shard = _shard_path(folder, file, path, "a shard")
        _check_file(shard, index, path, file)
        part = load_safetensors(shard)
        out.update({name: part[name] for name, shard in weight_map.items() if shard == file})
    return out


def random_weights(cfg, seed=0, mtp_depths=0):
    """HF tensor name -> float32 array: weights ~ N(0, 0.02), norms ~ 1
    (with `mtp_depths`, multi-token prediction's modules' too)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in parameter_shapes(cfg, mtp_depths).items():
        def sample(shape, name=name):
            if "norm" in name or name.endswith("ln_1.weight") or name.endswith("ln_2.weight") \
                    or name.endswith("ln_f.weight"):
                return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            # (DeepSeek-V3's routing bias near 0: at the other biases' 0.5 it
            # outweighs the routers' sigmoid scores and every token goes to
            # the same experts, which tests no routing)
            scale = 0.02 if name.endswith("e_score_correction_bias") \
                else 0.5 if name.endswith("bias") else 0.08
            return (scale * rng.standard_normal(shape)).astype(np.float32)
        if "{e}" in name:
            for e in range(shape[0]):
                weights[name.replace("{e}", str(e))] = sample(shape[1:])
        else:
            weights[name] = sample(shape)
    return weights


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "mistral": "MistralForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "gpt2": "GPT2LMHeadModel",
                 "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM"}


def save_pretrained(directory, hf_config, weights):
    """A Hugging Face model directory (config.json + model.safetensors) that
    `transformers.AutoModelForCausalLM.from_pretrained` loads."""
    import os
    os.makedirs(directory, exist_ok=True)
    config = dict(hf_config)
    config.setdefault("architectures", [ARCHITECTURES[config["model_type"]]])
    config.setdefault("torch_dtype", "float32")
    # No dropout anywhere: the comparison is of deterministic forward passes.
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        config.setdefault(key, 0.0)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_safetensors(os.path.join(directory, "model.safetensors"), weights)
