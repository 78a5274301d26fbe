"""`python -m bertjax.data.prepare --config=CONFIG --output=URL [Beam pipeline options]`: a
sharded token store on Apache Beam, for corpora too large for one host (the command's face; the
pipeline is bertjax/data/store/beam_prepare.py)."""

if __name__ == "__main__":
    from bertjax.data.store import beam_prepare

    beam_prepare.main()
