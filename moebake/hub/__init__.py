"""The Hugging Face Hub end of moebake: Hub repos as conversion sources, and publishing baked outputs.

* :mod:`moebake.hub.client`: the client (an ``HfApi``, or a fake with the same methods in tests)
  and the conversion of its errors into one-line MoebakeErrors;
* :mod:`moebake.hub.download`: ``org/name[@revision]`` -> a local snapshot of only the files a
  conversion needs, with the resolved commit;
* :mod:`moebake.hub.model_card`: the ``README.md`` model card of a baked output;
* :mod:`moebake.hub.publish`: verify, write the card, create the repo, ``upload_folder``.
"""
