#!/bin/bash
# Wikipedia dump -> indexed dataset for --data-path.
#   bash script/data_processing/prepare_wikipedia.sh INPUT OUTPUT_DIR [TOKENIZER_DIR]
# INPUT: a JSONL file with a "text" field per article, or the output directory of
# WikiExtractor --json (files of JSON lines). TOKENIZER_DIR: a local Hugging Face tokenizer
# (e.g. Llama 3's); without it the built-in byte-level tokenizer is used.
# Writes OUTPUT_DIR/wikipedia_processed_text_document.{bin,idx}; pass
# --data-path OUTPUT_DIR/wikipedia_processed_text_document (the launch scripts' DATA_PATH).
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
input=$1 out=$2 tokenizer=${3:-}
mkdir -p "$out"
jsonl=$input
if [ -d "$input" ]; then
    jsonl="$out/wikipedia_concatenated.jsonl"
    echo "concatenating WikiExtractor files under $input into $jsonl"
    find "$input" -type f -name 'wiki_*' | sort | xargs cat > "$jsonl"
fi
tokenizer_args=(--tokenizer-type ByteTokenizer)
[ -n "$tokenizer" ] && tokenizer_args=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tokenizer")
python "$(dirname "$0")/preprocess_data.py" --input "$jsonl" --output-prefix "$out/wikipedia_processed" \
    --json-keys text --append-eod "${tokenizer_args[@]}"
