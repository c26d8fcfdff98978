"""Accuracy: GSM8K and GPQA-diamond against any OpenAI-compatible server, paired across arms.

    (the spec, AccuracySpec, is the recipe's `accuracy:` block: pipeline/config/accuracy.py)
    stage.py      run_accuracy(spec, url=, model=, out_dir=, api_key=) -> AccuracyResult
    cli.py        `pipeline eval` (add_eval_arguments, run_eval, eval_main)
    compare.py    paired tests between arms (McNemar, sign-flip, output divergence)
    gsm8k.py, gpqa.py   prompts and answer extraction; data.py datasets; client.py HTTP
    synthetic.py  the project's own synthetic items
"""
