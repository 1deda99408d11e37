"""Images in chat (spec §9): mmproj configuration, preprocessing, the numpy vision tower, multimodal prompts."""
