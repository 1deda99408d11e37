"""Finding, fetching and keeping Qwen3.5/3.6 GGUFs from the Hugging Face Hub (issue 31), on `huggingface_hub`.

`catalog` searches and lists repositories, `remote_header` reads a remote file's GGUF header with ranged
reads, `fit` turns the header into a verdict on the user's cards, `download` fetches a file resumably and
checks it against the Hub's sha256, `library` keeps the models folder's index. No Qt, no HTTP server.
"""
