"""Speed measurements on a card, apart from the runtime: `rigllm bench` (speed, microbench, profile), the MTP,
multi-card, sparse-prefill and vision-tower benchmarks, and the random on-card weights they run without a file."""
