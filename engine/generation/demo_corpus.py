"""A small built-in training text for the demo model and the tiny test models' tokenizers.

It is a few KB of everything the real model sees — several scripts (CJK, Hangul, Arabic, Cyrillic,
Devanagari with combining marks), emoji, code, JSON and ChatML-shaped turns with reasoning and a tool
call — so a tokenizer trained on it learns merges in every class of the qwen35 pre-tokenizer regex.
Written for this project; each entry is one training document.
"""

from __future__ import annotations

DEMO_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. The dog did not mind; it was a very lazy dog.\n"
    "A small model can still learn that words repeat, that sentences end with a full stop, and that\n"
    "numbers like 3, 14, 159 and 2026 are written one digit at a time by this tokenizer.\n",
    "Mining cards were built to hash, not to draw pictures. With enough patience they can also run a\n"
    "language model: the weights are split across several cards, and each card computes its share of\n"
    "the layers before passing the hidden state to the next one.\n",
    "It's raining, isn't it? I've said we'll go anyway; they'd rather stay. You're right, she's late.\n"
    "DON'T SHOUT. We'Ve a'lL seen it before.\n",
    "\tIndented with a tab.\n    Indented with four spaces.\n\n\nThree newlines above, trailing spaces here:   \n",
    "我想在苹果公司工作。今天天气很好，我们去公园散步吧。机器学习模型需要大量的数据和计算。\n"
    "你好，世界！这是一个小小的语言模型，它只认识很少的词。\n",
    "日本語のテキストも少し入れておきます。東京は大きな都市です。ひらがなとカタカナと漢字。\n",
    "안녕하세요. 오늘은 날씨가 좋습니다. 한국어 문장도 토크나이저가 배워야 합니다.\n",
    "مرحبا بالعالم. هذه جملة باللغة العربية، وهي تُكتب من اليمين إلى اليسار.\n",
    "Привет, мир! Это небольшой текст на русском языке. нещо на Български.\n",
    "नमस्ते दुनिया। हिन्दी में मात्राएँ संयोजक चिह्न हैं, जैसे कि ि ी ु ू।\n",
    "Ça va très bien, merci. Über den Wolken muss die Freiheit wohl grenzenlos sein. "
    "Años atrás, el niño comió piña. e\u0301 is e plus a combining acute accent.\n",
    "Emoji: 🚀 rocket, 🦙🦙 two llamas, 😶\u200d🌫️ face in clouds, 👩\u200d💻 technologist, "
    "👨\u200d👩\u200d👧\u200d👦 family, 🇩🇪 flag, ✅ done, 👍🏽 thumbs up.\n",
    "def fibonacci(n: int) -> list[int]:\n"
    "    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
    "    values = [0, 1]\n"
    "    while len(values) < n:\n"
    "        values.append(values[-1] + values[-2])\n"
    "    return values[:n]\n\n\n"
    "if __name__ == \"__main__\":\n"
    "    print(fibonacci(10))\n",
    "function greet(name) {\n  const message = `Hello, ${name}!`;\n  console.log(message);\n"
    "  return message.length;\n}\n\nfor (let i = 0; i < 3; i++) { greet(\"world\"); }\n",
    "#include <stdio.h>\nint main(void) {\n    int total = 0;\n    for (int i = 1; i <= 100; ++i) total += i;\n"
    "    printf(\"%d\\n\", total);\n    return 0;\n}\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}\n'
    '[{"id": 1, "ok": true, "score": 0.95}, {"id": 2, "ok": false, "score": null}]\n',
    "SELECT name, COUNT(*) AS n FROM users WHERE active = 1 GROUP BY name ORDER BY n DESC LIMIT 10;\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nTwelve times seven: 12 * 7 = 84.\n</think>\n\n12 times 7 is 84.<|im_end|>\n",
    "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI should call the weather tool.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"temperature\": 18, \"sky\": \"cloudy\"}\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 18 °C and cloudy in Paris.<|im_end|>\n",
    "<|im_start|>user\nTranslate 'good morning' into Chinese, Korean and Arabic.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n早上好 · 좋은 아침 · صباح الخير<|im_end|>\n",
    "<|im_start|>user\nWrite a haiku about graphics cards.<|im_end|>\n"
    "<|im_start|>assistant\nSilent fans at rest,\nthe mining rig learns to speak —\n"
    "warm words, one by one.<|im_end|>\n",
    "Numbers and symbols: 3.3 3..3 3...3 1,000,000 -42 +7 50% $19.99 €5 ~~~ ------======= "
    "''''''```````\"\"\"\"......!!!!!!??????\n",
)
